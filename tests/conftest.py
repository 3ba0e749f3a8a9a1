"""Shared fixtures: a real 2-process Dask LocalCluster for the tests that need one."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def cluster_client():
    """A LocalCluster with two worker processes (started once per test session)."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with Client(cluster) as client:
            yield client
