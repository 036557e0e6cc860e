"""The one place numpy and torch dtypes are translated into each other."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

__all__ = ["numpy_dtype", "torch_dtype"]


def numpy_dtype(dtype: Any) -> np.dtype[Any]:
    """The numpy dtype of a torch dtype or of anything ``np.dtype`` accepts.

    Raises:
        TypeError / RuntimeError: the dtype has no numpy equivalent (``torch.bfloat16``, say).
    """
    if isinstance(dtype, torch.dtype):
        return _numpy_of_torch(dtype)
    result: np.dtype[Any] = np.dtype(dtype)
    return result


@functools.cache
def _numpy_of_torch(dtype: torch.dtype) -> np.dtype[Any]:
    result: np.dtype[Any] = np.dtype(torch.empty(0, dtype=dtype).numpy().dtype)
    return result


@functools.cache
def torch_dtype(dtype: np.dtype[Any]) -> torch.dtype:
    """The torch dtype of a numpy dtype (cached: it is asked for every batch)."""
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype
