"""BLAS threading for the solvers' driver-side dense algebra.

Solvers factorise and multiply n x n matrices in the driver (Newton systems, SVM kernels, ridge
solves). For n up to a few thousand these are too small for BLAS threads to pay off, and next to
Dask's threads or other jobs on a shared node multi-threaded OpenBLAS spins and oversubscribes:
SpicyMKL on the IDA protocol (n = 200, M = 50) measured 10.4 s with OpenBLAS's default threads on a
loaded 2-core machine against 0.24 s with one thread. So a fit with n <= SMALL_N runs with one BLAS
thread; larger problems keep the library default, where threading pays for the O(n^3) solves.
Fits on factor engines (``representation == "factor"``) run with one BLAS thread at any n: their
algebra is O(n R^2) on tall, thin matrices, where threads gain little and oversubscription costs much
(EasyMKL at n = 20,000, R = 32 on the loaded 2-core machine: 17 s with the default threads against
0.2 s with one).
"""

from __future__ import annotations

import functools

from threadpoolctl import threadpool_limits

SMALL_N = 2000


def single_blas_thread_for_small_n(fit):
    """Decorate ``fit(engine_or_source, ...)``: one BLAS thread while it runs if its ``.n`` <= SMALL_N
    or it holds factors (module docstring)."""

    @functools.wraps(fit)
    def wrapper(engine, *args, **kwargs):
        n = getattr(engine, "n", None)
        factor = getattr(engine, "representation", "dense") == "factor"
        if factor or (isinstance(n, int) and n <= SMALL_N):
            with threadpool_limits(limits=1, user_api="blas"):
                return fit(engine, *args, **kwargs)
        return fit(engine, *args, **kwargs)

    return wrapper
