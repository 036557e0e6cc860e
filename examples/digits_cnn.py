"""Train a small CNN on scikit-learn's digits, read from DuckDB as PNG blobs.

The 1,797 8×8 digit images bundled with scikit-learn are written into an in-memory DuckDB table
as PNG files (a BLOB column) with their labels. Two loaders read it back: the PNGs are decoded
in the fetch threads by :func:`ddbloader.vision.decode_images` (torchvision when installed, else
Pillow), passed through a pipeline (torchvision v2 augmentation for training when available),
and the labels become one-hot vectors by :func:`ddbloader.transforms.one_hot`. A small CNN
trains for one epoch on four fifths of the images and reports its accuracy on the rest.

    python examples/digits_cnn.py [--decoder torchvision|pillow] [--epochs N] [--batch-size B]

Needs scikit-learn, and torchvision (``pip install 'ddbloader[vision]'``) or Pillow.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
from collections.abc import Callable, Sequence

import duckdb
import numpy as np
import pyarrow as pa
import torch
from torch import nn

from ddbloader import DDBDataLoader
from ddbloader.transforms import one_hot
from ddbloader.vision import decode_images

CLASSES = 10
#: One image in five (``id % 5 = 0``) is held out for testing.
TEST_SQL = "SELECT png, label FROM digits WHERE id % 5 = 0 ORDER BY id"
TRAIN_SQL = "SELECT png, label FROM digits WHERE id % 5 <> 0 ORDER BY id"


def has_torchvision() -> bool:
    """True when torchvision is installed and loads with this torch."""
    if importlib.util.find_spec("torchvision") is None:
        return False
    try:
        importlib.import_module("torchvision.io")
    except Exception:  # a torchvision built for another torch fails to load its operators
        return False
    return True


def encode_png(pixels: np.ndarray) -> bytes:
    """One ``[H, W]`` uint8 image as PNG bytes, with torchvision if it loads, else Pillow."""
    if has_torchvision():
        tv_io = importlib.import_module("torchvision.io")
        return bytes(tv_io.encode_png(torch.from_numpy(pixels)[None]).numpy())
    image_module = importlib.import_module("PIL.Image")
    buffer = io.BytesIO()
    image_module.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def digits_database() -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with table ``digits(id INTEGER, label INTEGER, png BLOB)``."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    pixels = np.round(digits.images * (255 / 16)).astype(np.uint8)  # 0..16 → 0..255
    data = pa.table(  # noqa: F841 -- read by name by DuckDB's replacement scan below
        {
            "id": pa.array(np.arange(len(pixels)), pa.int32()),
            "label": pa.array(digits.target, pa.int32()),
            "png": pa.array([encode_png(p) for p in pixels], pa.binary()),
        }
    )
    connection = duckdb.connect()
    connection.execute("CREATE TABLE digits AS SELECT * FROM data")
    return connection


def to_unit_float(image: torch.Tensor) -> torch.Tensor:
    """uint8 ``[C, H, W]`` → float32 in ``[0, 1]`` (the pipeline without torchvision)."""
    return image.to(torch.float32) / 255


def pipeline(decoder: str, train: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """The per-image pipeline: torchvision v2 (with a mild random affine when training), or a scale."""
    if decoder != "torchvision":
        return to_unit_float
    v2 = importlib.import_module("torchvision.transforms.v2")
    steps = [v2.RandomAffine(degrees=8, translate=(0.1, 0.1))] if train else []
    return v2.Compose([*steps, v2.ToDtype(torch.float32, scale=True)])


def digits_loader(
    connection: duckdb.DuckDBPyConnection, sql: str, decoder: str, train: bool, batch_size: int
) -> DDBDataLoader:
    """x: ``[B, 1, 8, 8]`` float32 images; y: ``[B, 10]`` one-hot labels."""
    return DDBDataLoader(
        connection,
        sql,
        target_col="label",
        input_col="png",
        batch_size=batch_size,
        shuffle=train,
        seed=0,
        dtype=torch.float32,
        transform=[
            decode_images("png", pipeline(decoder, train), mode="GRAY", decoder=decoder),
            one_hot("label", CLASSES),
        ],
    )


def small_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),  # 8×8 → 4×4
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),  # 4×4 → 2×2
        nn.Flatten(),
        nn.Linear(64 * 2 * 2, CLASSES),
    )


def accuracy(model: nn.Module, loader: DDBDataLoader) -> float:
    model.eval()
    right = total = 0
    with torch.no_grad():
        for x, y in loader:
            right += int((model(x).argmax(1) == y.argmax(1)).sum())
            total += len(y)
    return right / total


def main(argv: Sequence[str] | None = None) -> float:
    """Train for ``--epochs`` (default 1) and return the test accuracy (also printed)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decoder", choices=["torchvision", "pillow"], default=None)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args(argv)
    decoder = args.decoder or ("torchvision" if has_torchvision() else "pillow")
    torch.manual_seed(0)
    connection = digits_database()
    model = small_cnn()
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn = nn.CrossEntropyLoss()  # a one-hot y is a class-probability target
    with (
        digits_loader(connection, TRAIN_SQL, decoder, True, args.batch_size) as train,
        digits_loader(connection, TEST_SQL, decoder, False, 256) as test,
    ):
        print(f"decoder: {decoder}; train batches: x {train.plan.layout.x_shape}, {len(train)} per epoch")
        for epoch in range(args.epochs):
            model.train()
            for x, y in train:
                optimiser.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                optimiser.step()
            result = accuracy(model, test)
            print(f"epoch {epoch}: last loss {loss.item():.3f}, test accuracy {result:.1%}")
    connection.close()
    return result


if __name__ == "__main__":
    main()
