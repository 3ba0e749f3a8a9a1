"""Issue 18: every way a command ends has its exit code (70 internal error, 141 broken pipe), run
directories are never overwritten silently, --resume leaves a finished run as it is, a damaged
finished-solver record is a clear error, checkpoint temp files of killed writers are swept, and
--rows reads only those rows of a memory-mapped .npy."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mklscale import cli
from mklscale.bank import build_bank, families
from mklscale.datasets import load as load_dataset
from mklscale.runtime.checkpoint import STALE_TEMP_S, write_atomic

ROOT = Path(__file__).resolve().parents[1]
PIPELINE = """
name = "exits"
[dataset]
name = "breast_cancer"
test_fraction = 0.3
max_train = {max_train}
[bank]
families = [{{ family = "gaussian", widths = [1, 2], features = "all" }}]
[[solver]]
name = "uni"
solver = "uniform"
[report]
enabled = false
"""
CLUSTER = 'kind = "local"\nn_workers = 1\nprocesses = false\n'


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def test_an_unexpected_exception_is_one_line_exit_70_and_a_saved_traceback(tmp_path, monkeypatch, capsys):
    def broken(args):
        return 1 / 0

    monkeypatch.setattr(cli, "_cmd_info", broken)
    assert cli.main(["bank", "info", str(tmp_path)]) == cli.EXIT_INTERNAL
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    log = re.search(r"the traceback is in (\S+),", err).group(1)
    assert "ZeroDivisionError" in err and "Traceback" in Path(log).read_text()
    Path(log).unlink()


def test_bank_info_into_a_closed_pipe_exits_quietly(tmp_path):
    ds = load_dataset("breast_cancer")
    build_bank(ds.X[:30], families.gaussian([1, 2, 3, 4, 5, 6, 7]), tmp_path / "bank", progress=False)
    child = subprocess.Popen([sys.executable, "-m", "mklscale", "bank", "info", str(tmp_path / "bank")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    child.stdout.close()  # the reader goes away before the command writes (`| head` done reading)
    err = child.stderr.read().decode()
    assert child.wait(timeout=120) == cli.EXIT_BROKEN_PIPE
    assert err == "", err


def test_rows_of_a_huge_memmapped_npy_are_read_alone(tmp_path):
    """A 5 GB .npy (sparse: only the first rows hold data) with --rows 300 builds without reading the file."""
    big = tmp_path / "big.npy"
    X = np.lib.format.open_memmap(big, mode="w+", dtype=np.float64, shape=(21_000_000, 30))
    X[:300] = load_dataset("breast_cancer").X[:300]
    X.flush()
    del X
    assert big.stat().st_size > 5e9 and os.stat(big).st_blocks * 512 < 1e8  # sparse on disk
    # the peak resident set of this process's own address space (VmHWM; ru_maxrss would also count the
    # pytest process's resident set at fork, which exec keeps)
    code = ("import re, sys; from mklscale import cli; rc = cli.main(sys.argv[1:]); "
            "print('maxrss_kb', re.search(r'VmHWM:\\s*(\\d+)', open('/proc/self/status').read())[1]); sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code, "bank", "build", "--features", str(big), "--rows", "300",
                           "--family", "linear", "--kernel-features", "all", "--out", str(tmp_path / "bank"),
                           "--quiet"],
                          capture_output=True, text=True, env=_env(), timeout=300)
    assert done.returncode == 0, done.stderr
    assert "n=300" in done.stdout
    maxrss_gb = int(done.stdout.split("maxrss_kb")[1]) / 1e6
    assert maxrss_gb < 2.0, f"peak memory {maxrss_gb:.1f} GB: the whole file was read"


def test_temp_files_of_killed_checkpoint_writers_are_swept(tmp_path):
    target = tmp_path / "s.npz"
    stale = tmp_path / ".s.npz.tmp-0badc0de"      # left by a writer killed mid-write, long ago
    live = tmp_path / ".s.npz.tmp-5eedbeef"       # a writer still writing: its mtime is fresh
    stale.write_bytes(b"half a checkpoint")
    live.write_bytes(b"being written")
    old = time.time() - STALE_TEMP_S - 60
    os.utime(stale, (old, old))
    write_atomic(target, lambda fh: fh.write(b"new"))
    assert target.read_bytes() == b"new"
    assert not stale.exists() and live.exists()


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mklscale", "run", *argv, "--quiet"], capture_output=True, text=True,
                          env=_env(), timeout=300)


@pytest.mark.cluster
def test_run_directories_are_not_overwritten_silently_and_resume_keeps_a_finished_run(tmp_path):
    spec, cluster = tmp_path / "p.toml", tmp_path / "c.toml"
    spec.write_text(PIPELINE.format(max_train=40))
    cluster.write_text(CLUSTER)
    run_dir = tmp_path / "run"
    args = (str(spec), "--cluster", str(cluster), "--out", str(run_dir))
    assert _run(*args).returncode == 0
    results = (run_dir / "results.json").read_bytes()

    again = _run(*args)                      # into the same folder, without a flag: refused, nothing touched
    assert again.returncode == 2 and "Traceback" not in again.stderr
    assert "holds an earlier run" in again.stderr and "--resume" in again.stderr and "--overwrite" in again.stderr
    assert (run_dir / "results.json").read_bytes() == results

    resumed = _run(*args, "--resume")        # a finished run: results (timings included) kept byte for byte
    assert resumed.returncode == 0, resumed.stderr
    assert (run_dir / "results.json").read_bytes() == results

    spec.write_text(PIPELINE.format(max_train=30))   # other training rows: the bank in --out no longer fits
    (run_dir / "results.json").unlink()
    mismatch = _run(*args, "--resume")
    assert mismatch.returncode == 2 and "pass --overwrite to mklscale run" in mismatch.stderr, mismatch.stderr
    replaced = _run(*args, "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    assert json.loads((run_dir / "results.json").read_text())["dataset"]["n_train"] == 30

    (run_dir / "results.json").unlink()       # stopped after the solver finished: its record is truncated
    done = run_dir / "checkpoints" / "uni.done.json"
    done.write_text(done.read_text()[:40])
    damaged = _run(*args, "--resume")
    assert damaged.returncode == 2 and "Traceback" not in damaged.stderr
    assert f"{done} is unreadable" in damaged.stderr and "delete it to run uni again" in damaged.stderr
