"""Banks on S3-compatible object stores (issue 20), against a real SeaweedFS server (conftest
``s3_server``: started on 127.0.0.1, skipped with the reason where ``weed`` cannot start)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from _slow_build import slow_shard_writes, wait_for_kernels

from mklscale.bank import KernelBank, build_bank, families
from mklscale.bank.storage.location import ObjectURL, bank_location
from mklscale.cli import main
from mklscale.engine import Engine
from mklscale.errors import InvalidInputError, NotABankError, ObjectStoreError

LAYOUT = dict(chunk_mb=0.02, shard_mb=0.05)  # 60 x 60 float32 kernels: 1 per chunk, 3 per shard


@pytest.fixture(scope="module")
def data():
    X = np.random.default_rng(0).normal(size=(60, 4))
    return X, families.random_subsets(4, 11, seed=1)


@pytest.fixture(scope="module")
def local_bank(data, tmp_path_factory):
    X, specs = data
    return build_bank(X, specs, tmp_path_factory.mktemp("local") / "bank.zarr", progress=False, **LAYOUT)


# ---- locations (no server) ---------------------------------------------------------------------------
@pytest.mark.parametrize("url", ["gs://bucket/bank.zarr", "http://host/bank.zarr", "az://c/bank", "S3X://b/p"])
def test_unsupported_scheme_is_refused_and_writes_nothing(url, data, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    X, specs = data
    with pytest.raises(InvalidInputError, match="unsupported URL scheme"):
        build_bank(X, specs, url, progress=False)
    with pytest.raises(InvalidInputError, match="unsupported URL scheme"):
        KernelBank.open(url)
    assert list(tmp_path.iterdir()) == []  # no local folder named "gs:" (what happened before)
    assert main(["bank", "info", url]) == 2


def test_bank_urls_are_parsed_and_never_carry_credentials(tmp_path):
    url = bank_location("s3://my-bucket/some/bank.zarr", {"secret_access_key": "TOPSECRET", "retry_timeout_s": 5})
    assert isinstance(url, ObjectURL) and (url.bucket, url.prefix, url.name) == ("my-bucket", "some/bank.zarr", "bank.zarr")
    assert "TOPSECRET" not in str(url) + repr(url) and str(url) == "s3://my-bucket/some/bank.zarr"
    assert url == bank_location("s3://my-bucket/some/bank.zarr/")
    assert bank_location(f"file://{tmp_path}/b") == tmp_path / "b"
    for bad, why in [("s3://key:secret@bkt/b", "credentials"), ("s3://bkt", "whole bucket"), ("s3://B_/x", "bucket name"),
                     ("s3://bkt/a/../b", "prefix"), ("s3://bkt/b?x=1", "query")]:
        with pytest.raises(InvalidInputError, match=why):
            bank_location(bad)
    with pytest.raises(InvalidInputError, match="unknown storage option"):
        bank_location("s3://bkt/b", {"password": "x"})
    with pytest.raises(InvalidInputError, match="apply only to object-store URLs"):
        bank_location(tmp_path, {"region": "x"})


# ---- access errors ----------------------------------------------------------------------------------
def test_missing_bucket_and_wrong_credentials_fail_before_any_work(s3_server, s3_bucket, data):
    X, specs = data
    with pytest.raises(ObjectStoreError, match=r"bucket 'no-such-bucket-h20' does not exist"):
        KernelBank.open("s3://no-such-bucket-h20/bank.zarr")
    with pytest.raises(ObjectStoreError, match="does not exist"):
        build_bank(X, specs, "s3://no-such-bucket-h20/bank.zarr", progress=False)
    wrong = {"secret_access_key": "not-the-secret"}
    with pytest.raises(ObjectStoreError, match="access denied") as err:
        build_bank(X, specs, f"s3://{s3_bucket}/bank.zarr", progress=False, storage_options=wrong)
    assert "not-the-secret" not in str(err.value)
    assert s3_server.client().list_objects_v2(Bucket=s3_bucket).get("KeyCount", 0) == 0  # nothing written
    with pytest.raises(NotABankError, match="no kernel bank at"):
        KernelBank.open(f"s3://{s3_bucket}/nothing.zarr")
    assert main(["bank", "info", "s3://no-such-bucket-h20/b"]) == 2


# ---- build, read, engine ------------------------------------------------------------------------------
def test_bank_on_s3_equals_local_bit_for_bit(s3_bucket, data, local_bank):
    X, specs = data
    url = f"s3://{s3_bucket}/dense.zarr"
    bank = build_bank(X, specs, url, progress=False, **LAYOUT)
    assert bank.storage.reachable_from_workers and str(bank.path) == url and bank.complete.all() and bank.n_shards == 4
    np.testing.assert_array_equal(bank.checksums, local_bank.checksums)
    for s in range(bank.n_shards):
        np.testing.assert_array_equal(bank.read_shard(s), local_bank.read_shard(s))
    np.testing.assert_array_equal(bank.kernel(5), local_bank.kernel(5))  # through zarr's ObjectStore
    # threads: the session's cluster_client (the default client once a test used it) has workers started
    # before this server's AWS_* variables existed; workers of a real deployment get them from their environment
    np.testing.assert_array_equal(bank.to_xarray()[3].compute(scheduler="threads").values, local_bank.kernel(3))
    np.testing.assert_array_equal(bank.cross(X[:7], kernels=[0, 4]), local_bank.cross(X[:7], kernels=[0, 4]))
    assert bank.verify().ok

    U = np.random.default_rng(1).normal(size=(3, 60))
    remote_engine, local_engine = Engine(url, cache_bytes=0), Engine(local_bank, cache_bytes=0)
    np.testing.assert_array_equal(remote_engine.quad_forms(U), local_engine.quad_forms(U))
    np.testing.assert_array_equal(remote_engine.matvecs(U[:1], [0, 4, 10]), local_engine.matvecs(U[:1], [0, 4, 10]))
    np.testing.assert_array_equal(remote_engine.combine(np.linspace(0, 1, 11)), local_engine.combine(np.linspace(0, 1, 11)))
    np.testing.assert_array_equal(remote_engine.blocks([2, 9]), local_engine.blocks([2, 9]))
    # a rebuilt bank: the same call resumes (nothing to do)
    assert build_bank(X, specs, url, progress=False, **LAYOUT).last_build_computed == 0

    from mklscale.estimators import MKLClassifier

    y = np.where(X[:, 0] + X[:, 1] > 0, 1, -1)
    on_s3 = MKLClassifier(solver="spicy", C=0.1).fit_bank(url, y)
    on_disk = MKLClassifier(solver="spicy", C=0.1).fit_bank(local_bank.path, y)
    np.testing.assert_array_equal(on_s3.kernel_weights_.to_numpy(), on_disk.kernel_weights_.to_numpy())
    assert on_s3.fit_stats_["bank"] == url


def test_factor_bank_on_s3_equals_local(s3_bucket, data, tmp_path):
    X, specs = data
    url = f"s3://{s3_bucket}/factor.zarr"
    bank = build_bank(X, specs, url, progress=False, rank=8, max_error=1.0, **LAYOUT)
    local = build_bank(X, specs, tmp_path / "f.zarr", progress=False, rank=8, max_error=1.0, **LAYOUT)
    np.testing.assert_array_equal(bank.checksums, local.checksums)
    np.testing.assert_array_equal(bank.factors([1, 7]), local.factors([1, 7]))
    U = np.random.default_rng(2).normal(size=(2, 60))
    np.testing.assert_array_equal(Engine(url).quad_forms(U), Engine(local).quad_forms(U))
    assert bank.verify().ok


def test_build_killed_resumes_exactly_the_unfinished_shards(s3_bucket, data, local_bank, tmp_path):
    X, specs = data
    url = f"s3://{s3_bucket}/killed.zarr"
    np.save(tmp_path / "X.npy", X)
    script = slow_shard_writes(0.3) + textwrap.dedent(f"""
        import numpy as np
        from mklscale.bank import build_bank, families
        X = np.load({str(tmp_path / 'X.npy')!r})
        build_bank(X, families.random_subsets(4, 11, seed=1), {url!r}, progress=False, flush_every_s=0,
                   chunk_mb=0.02, shard_mb=0.05)
    """)  # one shard every 0.3 s, so the kill lands mid-build
    proc = subprocess.Popen([sys.executable, "-c", script], env=os.environ.copy())
    if wait_for_kernels(url, 3, proc) >= 3:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the build finished before it could be killed"
    before = KernelBank.open(url).complete
    assert 0 < before.sum() < len(specs)
    resumed = build_bank(X, specs, url, progress=False, **LAYOUT)
    assert resumed.last_build_computed == len(specs) - before.sum()
    np.testing.assert_array_equal(resumed.checksums, local_bank.checksums)
    assert resumed.verify().ok


# ---- integrity, copy, CLI -------------------------------------------------------------------------------
def test_verify_finds_deleted_and_truncated_objects_and_repair_reuploads_only_those(s3_server, s3_bucket, data,
                                                                                    local_bank, capsys):
    X, specs = data
    url = f"s3://{s3_bucket}/damaged.zarr"
    build_bank(X, specs, url, progress=False, **LAYOUT)
    s3 = s3_server.client()
    key = lambda s: f"damaged.zarr/gram/c/{s}/0/0"  # noqa: E731
    s3.delete_object(Bucket=s3_bucket, Key=key(1))
    body = s3.get_object(Bucket=s3_bucket, Key=key(3))["Body"].read()
    s3.put_object(Bucket=s3_bucket, Key=key(3), Body=body[: len(body) // 2])
    untouched = {s: s3.head_object(Bucket=s3_bucket, Key=key(s))["ETag"] for s in (0, 2)}

    assert main(["bank", "verify", url, "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "shard object gram/c/1/0/0 is missing" in out and "kernel 9" in out
    bank = KernelBank.open(url)
    assert sorted(np.flatnonzero(~bank.complete).tolist()) == [3, 4, 5, 9, 10]
    with pytest.raises(Exception, match="repair"):
        Engine(url)
    assert main(["bank", "repair", url, "--quiet"]) == 0
    assert "repaired 5 kernel(s)" in capsys.readouterr().out
    assert {s: s3.head_object(Bucket=s3_bucket, Key=key(s))["ETag"] for s in (0, 2)} == untouched
    repaired = KernelBank.open(url)
    assert repaired.complete.all() and repaired.verify().ok
    np.testing.assert_array_equal(repaired.checksums, local_bank.checksums)


def test_copy_between_folder_and_bucket_both_ways(s3_bucket, data, local_bank, tmp_path, capsys):
    X, _ = data
    np.save(tmp_path / "X.npy", X)
    built = f"s3://{s3_bucket}/cli.zarr"
    assert main(["bank", "build", "--features", str(tmp_path / "X.npy"), "--family", "gaussian", "--widths", "1", "2",
                 "--kernel-features", "all", "--out", built, "--quiet"]) == 0
    assert f"bank: {built}" in capsys.readouterr().out and KernelBank.open(built).complete.all()
    url = f"s3://{s3_bucket}/copied.zarr"
    assert main(["bank", "copy", str(local_bank.path), url, "--quiet"]) == 0
    assert "OK" in capsys.readouterr().out
    back = tmp_path / "back.zarr"
    assert main(["bank", "copy", url, str(back), "--quiet"]) == 0
    for bank in (KernelBank.open(url), KernelBank.open(back)):
        np.testing.assert_array_equal(bank.checksums, local_bank.checksums)
        np.testing.assert_array_equal(bank.read_shard(2), local_bank.read_shard(2))
    assert main(["bank", "copy", str(local_bank.path), url]) == 2  # not empty, no --overwrite
    assert main(["bank", "copy", str(local_bank.path), url, "--overwrite", "--quiet"]) == 0
    assert main(["bank", "info", url, "--json"]) == 0
    assert f'"path": "{url}"' in capsys.readouterr().out


# ---- a cluster whose workers share no path with the driver --------------------------------------------
@pytest.mark.cluster
def test_two_workers_in_other_directories_build_and_read_from_the_server_and_survive_a_kill(s3_bucket, data, local_bank, tmp_path,
                                                                         monkeypatch):
    from distributed import Client, LocalCluster
    from test_reliability import run_with_a_kill

    X, specs = data
    elsewhere = tmp_path / "workers"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # worker processes start in this directory, not the driver's
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      local_directory=str(elsewhere)) as cluster:
        monkeypatch.chdir(tmp_path)
        with Client(cluster) as client:
            cwds = set(client.run(os.getcwd).values())
            assert cwds == {str(elsewhere)} and os.getcwd() != str(elsewhere)
            url = f"s3://{s3_bucket}/cluster.zarr"
            bank = build_bank(X, specs, url, client=client, progress=False, **LAYOUT)  # shards PUT by the workers
            np.testing.assert_array_equal(bank.checksums, local_bank.checksums)
            U = np.random.default_rng(3).normal(size=(2, 60))
            engine = Engine(url, client=client, cache_bytes=0, task_bytes=60 * 60 * 4)  # one kernel per task
            np.testing.assert_array_equal(engine.quad_forms(U), Engine(local_bank).quad_forms(U))
            np.testing.assert_array_equal(engine.combine(np.arange(11.0)), Engine(local_bank).combine(np.arange(11.0)))
            # a worker killed mid-pass: its tasks rerun elsewhere, the result is the same bit for bit
            got = run_with_a_kill(client, tmp_path, "mklscale-quad_forms", 2, lambda: engine.quad_forms(U))
            np.testing.assert_array_equal(got, Engine(local_bank).quad_forms(U))
    assert not any(p.name.endswith(".zarr") for p in elsewhere.rglob("*")) and not (tmp_path / "s3:").exists()


# ---- faults -------------------------------------------------------------------------------------------
@pytest.fixture
def own_server(tmp_path):
    """A server of this test's own (it is stopped and restarted), with the session's credentials."""
    from _seaweed import SeaweedServer, SeaweedUnavailable

    server = SeaweedServer(tmp_path / "own-seaweed")
    try:
        server.start()
    except SeaweedUnavailable as exc:
        pytest.skip(f"no S3 server: {exc}")
    yield server
    server.stop()


@pytest.mark.slow
def test_server_stopped_mid_build_and_mid_pass(own_server, s3_server, data, local_bank, tmp_path):
    X, specs = data
    bucket = own_server.new_bucket()
    options = {"endpoint_url": own_server.endpoint, "retry_timeout_s": 3}
    url = bank_location(f"s3://{bucket}/bank.zarr", options)
    np.save(tmp_path / "X.npy", X)
    script = slow_shard_writes(0.5) + textwrap.dedent(f"""
        import numpy as np
        from mklscale.bank import build_bank, families
        X = np.load({str(tmp_path / 'X.npy')!r})
        build_bank(X, families.random_subsets(4, 11, seed=1), {str(url)!r}, progress=False, flush_every_s=0,
                   chunk_mb=0.02, shard_mb=0.05, storage_options={options!r})
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    wait_for_kernels(url, 3, proc)
    own_server.stop()
    _, err = proc.communicate(timeout=120)  # a bounded wait, then a clear error naming the URL
    assert proc.returncode == 1, err
    assert "ObjectStoreError" in err and str(url) in err and "cannot be reached" in err

    own_server.start()
    bank = KernelBank.open(url)
    done = bank.complete
    assert 0 < done.sum() < len(specs)
    assert bank.verify(kernels=np.flatnonzero(done).tolist()).ok  # every kernel marked complete is stored
    bank = build_bank(X, specs, url, progress=False, **LAYOUT)  # and the same call finishes it
    np.testing.assert_array_equal(bank.checksums, local_bank.checksums)

    engine = Engine(url, cache_bytes=0)
    U = np.ones((1, 60))
    np.testing.assert_array_equal(engine.quad_forms(U), Engine(local_bank).quad_forms(U))
    own_server.stop()
    with pytest.raises(ObjectStoreError, match=f"{url}.*cannot be reached"):
        engine.quad_forms(U)


def test_slow_down_responses_are_retried_with_backoff(s3_server, s3_bucket, data, local_bank):
    from _slowdown_proxy import SlowDownProxy

    X, specs = data
    with SlowDownProxy(s3_server.s3_port, every=3) as proxy:
        url = bank_location(f"s3://{s3_bucket}/throttled.zarr", {"endpoint_url": proxy.endpoint})
        bank = build_bank(X, specs, url, progress=False, **LAYOUT)
        U = np.random.default_rng(4).normal(size=(2, 60))
        np.testing.assert_array_equal(Engine(url, cache_bytes=0).quad_forms(U), Engine(local_bank).quad_forms(U))
        assert bank.verify().ok
        np.testing.assert_array_equal(bank.checksums, local_bank.checksums)
    assert proxy.refused > 10 and proxy.forwarded > 2 * proxy.refused - 2  # every third request was refused


def test_one_writer_per_bank_url_with_an_expiring_lock(s3_server, s3_bucket, data, local_bank):
    import json
    import threading

    from mklscale.bank.storage import objlock
    from mklscale.errors import BankLockedError

    X, specs = data
    url = bank_location(f"s3://{s3_bucket}/locked/bank.zarr")
    with objlock.object_writer(url, "test holder"):
        refused = []

        def second():  # another thread (the holder's own thread re-enters its lock)
            try:
                with objlock.object_writer(url, "second", wait=False):
                    pass
            except BankLockedError as exc:
                refused.append(str(exc))

        other = threading.Thread(target=second)
        other.start()
        other.join(30)
        assert refused and f"pid {os.getpid()} " in refused[0] and "test holder" in refused[0]
        built = []
        thread = threading.Thread(target=lambda: built.append(build_bank(X, specs, url, progress=False, **LAYOUT)))
        thread.start()  # a second writer waits for the first
        time.sleep(1.0)
        assert thread.is_alive() and not built
    thread.join(120)
    np.testing.assert_array_equal(built[0].checksums, local_bank.checksums)
    body = s3_server.client().get_object(Bucket=s3_bucket, Key="locked/.bank.zarr.lock")["Body"].read()
    assert json.loads(body)["released"]  # released: an expired record the next writer takes over

    # a writer that died leaves a lock that expires: the next one takes it over
    stale = {"pid": 1, "host": "gone", "what": "build", "token": "x", "count": 0, "since": "then",
             "expires": time.time() - 1}
    s3_server.client().put_object(Bucket=s3_bucket, Key="locked/.bank.zarr.lock", Body=json.dumps(stale).encode())
    with objlock.object_writer(url, "after a crash", wait=False):
        body = s3_server.client().get_object(Bucket=s3_bucket, Key="locked/.bank.zarr.lock")["Body"].read()
        assert json.loads(body)["what"] == "after a crash"


@pytest.mark.slow
def test_pipeline_bank_on_s3_keeps_credentials_out_of_the_run(s3_server, s3_bucket, tmp_path):
    import json

    from mklscale.errors import ConfigError
    from mklscale.pipeline import load_pipeline, run_pipeline

    spec = tmp_path / "p.toml"
    text = textwrap.dedent(f"""
        name = "s3bank"
        seed = 0
        [dataset]
        name = "breast_cancer"
        test_fraction = 0.25
        [bank]
        family = "gaussian"
        widths = [1.0, 4.0]
        features = "all"
        path = "s3://{s3_bucket}/run/bank.zarr"
        storage_options = {{ secret_access_key = "{s3_server.env()['AWS_SECRET_ACCESS_KEY']}", retry_timeout_s = 20 }}
        [[solver]]
        name = "uniform"
        solver = "uniform"
        [report]
        enabled = false
    """)
    spec.write_text(text)
    run_pipeline(spec, out=tmp_path / "run", quiet=True)
    bank = KernelBank.open(f"s3://{s3_bucket}/run/bank.zarr")
    assert bank.complete.all() and not (tmp_path / "run" / "bank.zarr").exists()
    secret = s3_server.env()["AWS_SECRET_ACCESS_KEY"]
    for f in (tmp_path / "run").rglob("*"):
        if f.is_file():
            assert secret not in f.read_text(errors="replace"), f
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["bank"]["path"] == f"s3://{s3_bucket}/run/bank.zarr"

    bad = spec.read_text().replace(f"s3://{s3_bucket}", "gs://elsewhere")
    spec.write_text(bad)
    with pytest.raises(ConfigError, match="unsupported URL scheme"):
        load_pipeline(spec)


def test_server_killed_mid_build_ends_the_cli_in_one_line_after_the_retry_deadline(own_server, s3_server, tmp_path):
    """The CLI, its server killed mid-build: exit 2, one line naming the URL, after the documented
    retry deadline (MKLSCALE_S3_RETRY_TIMEOUT_S=4 here), not obstore's dump and not a hang."""
    bucket = own_server.new_bucket()
    X = np.random.default_rng(0).normal(size=(60, 4))
    np.save(tmp_path / "X.npy", X)
    env = {**os.environ, **own_server.env(), "MKLSCALE_S3_RETRY_TIMEOUT_S": "4"}
    url = f"s3://{bucket}/killed.zarr"
    script = slow_shard_writes(0.3) + textwrap.dedent(f"""
        import sys
        from mklscale.bank import group
        from mklscale.cli import main
        layout = group.layout_for  # 3 kernels per shard, as LAYOUT
        group.layout_for = lambda M, n, item, chunk_mb=16, shard_mb=64, width=None: layout(M, n, item, 0.02, 0.05, width)
        sys.exit(main(["bank", "build", "--features", {str(tmp_path / "X.npy")!r}, "--out", {url!r}, "--family",
                       "random_subsets", "--n-kernels", "60", "--quiet"]))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stderr=subprocess.PIPE, text=True)
    wait_for_kernels(bank_location(url, {"endpoint_url": own_server.endpoint}), 3, proc)  # then kill the server
    stopped = time.monotonic()
    own_server.stop()
    _, err = proc.communicate(timeout=120)
    waited = time.monotonic() - stopped
    assert proc.returncode == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and url in lines[0] and "cannot be reached" in lines[0], err
    assert 3.0 < waited < 40.0, waited  # the deadline, once (not once per request left)
