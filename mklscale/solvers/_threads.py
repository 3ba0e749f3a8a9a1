"""BLAS threading for the solvers' driver-side dense algebra.

Solvers factorise and multiply n x n matrices in the driver (Newton systems, SVM kernels, ridge
solves). For n up to a few thousand these are too small for BLAS threads to pay off, and next to
Dask's threads or other jobs on a shared node multi-threaded OpenBLAS spins and oversubscribes:
SpicyMKL on the IDA protocol (n = 200, M = 50) measured 10.4 s with OpenBLAS's default threads on a
loaded 2-core machine against 0.24 s with one thread. So a fit with n <= SMALL_N runs with one BLAS
thread; larger problems keep the library default, where threading pays for the O(n^3) solves.
The engine's kernel representation decides (``Representation.one_blas_thread``): fits on factor
engines run with one BLAS thread at any n, their algebra being O(n R^2) on tall, thin matrices, where
threads gain little and oversubscription costs much (EasyMKL at n = 20,000, R = 32 on the loaded
2-core machine: 17 s with the default threads against 0.2 s with one).
"""

from __future__ import annotations

import functools

from threadpoolctl import threadpool_limits

from mklscale.engine.contract import KernelEngine
from mklscale.engine.representation import DENSE

SMALL_N = 2000


def single_blas_thread_for_small_n(fit):
    """Decorate ``fit(engine_or_source, ...)``: one BLAS thread while it runs if its ``.n`` <= SMALL_N
    or its kernels' representation asks for it (module docstring; a kernel source other than an
    engine counts as dense)."""

    @functools.wraps(fit)
    def wrapper(engine, *args, **kwargs):
        rep = engine.kernel_representation if isinstance(engine, KernelEngine) else DENSE
        if rep.one_blas_thread(getattr(engine, "n", None), SMALL_N):
            with threadpool_limits(limits=1, user_api="blas"):
                return fit(engine, *args, **kwargs)
        return fit(engine, *args, **kwargs)

    return wrapper
