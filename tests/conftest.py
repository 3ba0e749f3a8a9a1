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


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A SeaweedFS S3 server on 127.0.0.1 (tests/_seaweed.py), started once per session; the
    standard AWS_* variables point at it for the whole session (worker processes started later
    inherit them). Skips with the reason where the ``weed`` binary cannot start."""
    import os

    from _seaweed import SeaweedServer, SeaweedUnavailable

    pytest.importorskip("obstore", reason="the s3 extra (obstore) is not installed")
    pytest.importorskip("boto3", reason="boto3 (test extra) is not installed")
    server = SeaweedServer(tmp_path_factory.mktemp("seaweed"))
    try:
        server.start()
    except SeaweedUnavailable as exc:
        pytest.skip(f"no S3 server: {exc}")
    saved = {k: os.environ.get(k) for k in server.env()}
    os.environ.update(server.env())
    try:
        yield server
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


@pytest.fixture
def s3_bucket(s3_server):
    """A fresh, empty bucket on the session's S3 server."""
    return s3_server.new_bucket()
