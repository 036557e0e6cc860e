"""ddbloader: feed PyTorch training straight from SQL engines."""

from ._core.config import DDB_ALIASES
from .dataset import DDBIterableDataset
from .loader import DDBDataLoader
from .stats import LoaderStats

__all__ = ["DDB_ALIASES", "DDBDataLoader", "DDBIterableDataset", "LoaderStats"]
__version__ = "0.1.0"
