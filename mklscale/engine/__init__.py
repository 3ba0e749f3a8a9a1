"""Passes over a kernel bank and the driver-side cache of active kernel blocks.

``Engine`` (core.py) is the entry point; the layers under it, one job each:
plan.py (kernels -> tasks), runner.py (threaded or distributed Dask execution), tasks.py (what a
task does, on the worker), reader.py (shard files -> row panels in a reused buffer), kernels.py
(numba chunk kernels), simd.py (explicit vector IR with a fixed summation order), cache.py (LRU
block cache), validate.py (input checks).
"""

from mklscale.engine.core import Engine

__all__ = ["Engine"]
