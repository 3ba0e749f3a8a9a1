"""Passes over a kernel bank and the driver-side cache of active kernel blocks.

``KernelEngine`` (contract.py) is everything a solver may use; its implementations: ``Engine``
(core.py, streaming passes over a zarr bank), ``InMemoryEngine`` / ``InMemoryFactorEngine`` (memory.py, an (M, n, n) or (M, n, r) array)
and the views ``RowSubsetEngine`` / ``KernelSubsetEngine`` (views.py). The layers under ``Engine``,
one job each:
plan.py (kernels -> tasks), runner.py (threaded or distributed Dask execution), tasks.py (what a
task does, on the worker), reader.py (shard files -> row panels in a reused buffer), kernels.py
(numba chunk kernels; their vector IR with a fixed summation order is mklscale/simd.py), cache.py (LRU
block cache), validate.py (input checks). representation.py (Dense, Factor) holds every operation
that differs between the ways a bank holds its kernels; the engine and the solver toolkit ask it.
"""

from mklscale.engine.contract import Counters, KernelEngine
from mklscale.engine.core import Engine
from mklscale.engine.memory import InMemoryEngine, InMemoryFactorEngine
from mklscale.engine.views import KernelSubsetEngine, RowSubsetEngine

__all__ = ["Counters", "Engine", "InMemoryEngine", "InMemoryFactorEngine", "KernelEngine", "KernelSubsetEngine", "RowSubsetEngine"]
