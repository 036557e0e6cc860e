"""Render docs/loader_repr.png and docs/loader_stats.png: what Jupyter shows for a loader and its stats.

Usage::

    python docs/render_screenshots.py

Builds the demo factor table (8 symbols x 5 days x 240 rows x 16 factors) in an in-memory DuckDB,
the README's loader over it, and trains a small forecaster for one epoch so that the stats are
those of a real training loop. Each view is the loader's own ``_repr_html_`` inside a page styled
like a JupyterLab cell, photographed by headless Chromium (``apt-get install chromium``, or set
CHROMIUM to its path) and trimmed to its content with Pillow. Prints the text forms too, for the
README.
"""

from __future__ import annotations

import html
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import duckdb
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from ddbloader import DDBDataLoader  # noqa: E402 -- imported from this checkout
from ddbloader.demo import build_factor_table  # noqa: E402

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
    "--force-device-scale-factor=2",
]

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><style>
  body {{ margin: 0; padding: 16px; background: #fff; color: #212121;
         font-family: -apple-system, "Segoe UI", "DejaVu Sans", Helvetica, Arial, sans-serif;
         font-size: 14px; }}
  .cell {{ display: inline-block; min-width: 560px; }}
  .row {{ display: flex; align-items: flex-start; }}
  .prompt {{ width: 64px; flex: none; font-family: "DejaVu Sans Mono", monospace; font-size: 13px;
            padding-top: 6px; }}
  .in {{ color: #303f9f; }} .out {{ color: #d84315; }}
  .code {{ flex: 1; background: #f5f5f5; border: 1px solid #e0e0e0; border-radius: 2px; padding: 6px 8px;
          font-family: "DejaVu Sans Mono", monospace; font-size: 13px; white-space: pre; }}
  .output {{ flex: 1; padding: 6px 0; }}
</style></head>
<body><div class="cell">
  <div class="row"><div class="prompt in">[{n}]:</div><div class="code">{code}</div></div>
  <div class="row"><div class="prompt out">[{n}]:</div><div class="output">{output}</div></div>
</div></body></html>
"""


def chromium() -> str:
    for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name) if name else None
        if found:
            return found
    raise SystemExit("Chromium not found: apt-get install chromium, or set CHROMIUM to its path")


def screenshot(page: str, target: Path, width: int = 760, height: int = 900) -> None:
    """Photograph ``page`` (HTML text) with headless Chromium, then trim the white margin."""
    with tempfile.TemporaryDirectory() as work:
        source = Path(work, "page.html")
        source.write_text(page, encoding="utf-8")
        subprocess.run(
            [
                chromium(),
                *CHROMIUM_FLAGS,
                f"--user-data-dir={Path(work, 'profile')}",
                f"--window-size={width},{height}",
                f"--screenshot={target}",
                source.as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
    trim(target)


def trim(path: Path, margin: int = 16) -> None:
    """Crop ``path`` to its non-white content plus ``margin`` pixels (kept as is without Pillow)."""
    try:
        from PIL import Image, ImageChops
    except ImportError:
        return
    with Image.open(path) as image:
        rgb = image.convert("RGB")
    box = ImageChops.difference(rgb, Image.new("RGB", rgb.size, "white")).getbbox()
    if box is None:
        return
    left, top, right, bottom = box
    rgb.crop(
        (
            max(left - margin, 0),
            max(top - margin, 0),
            min(right + margin, rgb.width),
            min(bottom + margin, rgb.height),
        )
    ).save(path, optimize=True)


def build_loader() -> DDBDataLoader:
    con = duckdb.connect()
    build_factor_table(con, symbols=8, days=5, rows=240, factors=16)
    return DDBDataLoader(
        con,
        "SELECT * FROM factors ORDER BY symbol, ts",
        target_col="target",
        batch_size=64,
        shuffle=True,
        window_size=32,
        input_col=[f"f{k}" for k in range(16)],
        group_col="symbol",
        repartition_col="CAST(ts AS DATE)",
        seed=0,
        dtype=torch.float32,
    )


def train_one_epoch(loader: DDBDataLoader) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(32 * 16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y.reshape(-1, 1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def main() -> None:
    with build_loader() as loader:
        screenshot(PAGE.format(n=3, code="loader", output=loader._repr_html_()), HERE / "loader_repr.png")
        print(repr(loader))
        train_one_epoch(loader)
        stats = loader.stats()
        code = html.escape("for x, y in loader:\n    ...  # one epoch of training\nloader.stats()")
        screenshot(PAGE.format(n=4, code=code, output=stats._repr_html_()), HERE / "loader_stats.png")
        print(stats)
    for name in ("loader_repr.png", "loader_stats.png"):
        print(f"wrote {HERE / name} ({(HERE / name).stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
