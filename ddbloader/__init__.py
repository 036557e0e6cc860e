"""ddbloader: feed PyTorch training straight from SQL engines."""

from .config import DDB_ALIASES
from .loader import DDBDataLoader

__all__ = ["DDB_ALIASES", "DDBDataLoader"]
__version__ = "0.1.0"
