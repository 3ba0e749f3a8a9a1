"""Shared fixtures: a real 2-process Dask LocalCluster for the tests that need one."""

from __future__ import annotations

import pytest
from threadpoolctl import threadpool_limits

# The suite runs Dask threads and worker processes on 2 cores; BLAS threads on top of them only
# oversubscribe (a 500 x 500 Cholesky measured 100x slower with 2 OpenBLAS threads under load).
threadpool_limits(1)


@pytest.fixture(scope="session")
def cluster_client():
    """A LocalCluster with two worker processes (started once per test session)."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with Client(cluster) as client:
            yield client
