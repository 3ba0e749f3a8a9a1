"""Kernels a solver holds itself (its working set): fetched without an engine cache copy."""

from __future__ import annotations

import inspect

import numpy as np


def fetch_held(engine, idx) -> np.ndarray:
    """engine.blocks(idx) for kernels the caller will hold: ``keep=False`` where the engine has a
    block cache, so the cache does not keep a second copy of them."""
    if "keep" in inspect.signature(engine.blocks).parameters:
        return engine.blocks(idx, keep=False)
    return engine.blocks(idx)


def block_nbytes(engine) -> int:
    """Bytes of one kernel as ``engine.blocks`` returns it (engines that do not say: float64)."""
    return int(getattr(engine, "block_nbytes", engine.n * engine.n * 8))
