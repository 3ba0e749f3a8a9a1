"""Ctrl-C and SIGTERM anywhere in a command (issue 18 item 9): exit 75, one line, no traceback, resumable.

Each case starts the real command in a child process (``tests/_stop_child.py``: ``mklscale.cli.main``
held at one phase until a signal arrives), sends the signal to the child's whole process group as a
terminal's Ctrl-C or a batch system's SIGTERM does (the Dask worker processes get it too), and
checks: exit status 75; stderr is one line that names the signal, what was saved and the command
that continues; no traceback and no Dask worker noise anywhere in the output; then the continuing
command finishes the work.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mklscale.runtime.interrupt import EXIT_STOPPED

CHILD = Path(__file__).with_name("_stop_child.py")
ROOT = Path(__file__).resolve().parents[1]

PIPELINE = """
name = "stops"
[dataset]
name = "breast_cancer"
test_fraction = 0.3
max_train = 60
[bank]
families = [{{ family = "gaussian", widths = [1, 2, 5], features = "all" }}, {{ family = "linear", features = "all" }}]
[[solver]]
name = "{solver}"
solver = "{solver}"
{extra}
[report]
enabled = {report}
[checkpoint]
every_s = 0.05
"""
#: one worker process: the Ctrl-C sent to the process group reaches a real Dask worker
CLUSTER = 'kind = "local"\nn_workers = 1\nprocesses = true\n'
NOISE = ("Traceback", "KeyboardInterrupt", "lose scattered data", "distributed.", "Exception ignored")


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _stop(phase: str, argv: list[str], signum: int) -> tuple[int, str, str]:
    """Run the child until it pauses at ``phase``, signal its process group, return (status, stdout, stderr)."""
    child = subprocess.Popen([sys.executable, str(CHILD), phase, *argv], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=_env(), start_new_session=True)
    try:
        seen = []
        for line in child.stdout:
            seen.append(line)
            if line.strip() == f"PAUSED {phase}":
                break
        else:
            child.wait(timeout=60)
            pytest.fail(f"the command ended before phase {phase}: {''.join(seen)}{child.stderr.read()}")
        os.killpg(child.pid, signum)
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    return child.returncode, "".join(seen) + out, err


def _mklscale(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mklscale", *argv], capture_output=True, text=True, env=_env(),
                          timeout=300)


def _assert_one_clean_line(status: int, out: str, err: str, signame: str) -> str:
    assert status == EXIT_STOPPED, f"exit {status}\nstdout:\n{out}\nstderr:\n{err}"
    for noise in NOISE:
        assert noise not in out + err, f"{noise!r} in the output:\n{out}\n{err}"
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"stderr is not one line:\n{err}"
    assert lines[0].startswith(f"mklscale: stopped by {signame}"), lines[0]
    return lines[0]


def _pipeline(tmp_path: Path, solver: str, extra: str = "", report: bool = False) -> tuple[Path, Path]:
    spec, cluster = tmp_path / "p.toml", tmp_path / "cluster.toml"
    spec.write_text(PIPELINE.format(solver=solver, extra=extra, report=str(report).lower()))
    cluster.write_text(CLUSTER)
    return spec, cluster


@pytest.mark.cluster
@pytest.mark.parametrize("phase, solver, extra, report, signum", [
    ("build", "uniform", "", False, signal.SIGINT),
    ("citi", "citi", "C = 1.0", False, signal.SIGTERM),
    pytest.param("sgd", "sgd", "C = 0.1\nT = 5000\nseed = 3", False, signal.SIGINT, marks=pytest.mark.slow),
    pytest.param("uniform", "uniform", "", False, signal.SIGTERM, marks=pytest.mark.slow),
    pytest.param("report", "uniform", "", True, signal.SIGINT, marks=pytest.mark.slow),
], ids=["build-SIGINT", "citi-SIGTERM", "sgd-SIGINT", "uniform-SIGTERM", "report-SIGINT"])
def test_a_stopped_run_says_what_was_saved_and_resumes(tmp_path, phase, solver, extra, report, signum):
    spec, cluster = _pipeline(tmp_path, solver, extra, report)
    run_dir = tmp_path / "run"
    argv = ["run", str(spec), "--cluster", str(cluster), "--out", str(run_dir), "--quiet"]
    line = _assert_one_clean_line(*_stop(phase, argv, signum), signal.Signals(signum).name)
    assert "saved" in line and f"--out {run_dir} --resume" in line
    expected = {"build": "building the bank", "citi": "running solver citi", "sgd": "the state of sgd",
                "uniform": "running solver uniform", "report": "results.json"}[phase]
    assert expected in line, line
    if phase == "citi":
        assert "starts over" in line  # Citi keeps no checkpoint, and the line says so

    resumed = _mklscale(*argv, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    results = json.loads((run_dir / "results.json").read_text())
    assert [s["status"] for s in results["solvers"]] == ["ok"]
    if report:
        assert (run_dir / "report" / "index.html").is_file()


@pytest.mark.cluster
def test_a_stopped_bank_build_says_what_was_saved_and_the_same_command_continues(tmp_path):
    out = tmp_path / "bank.zarr"
    argv = ["bank", "build", "--dataset", "breast_cancer", "--rows", "60", "--family", "gaussian", "--widths",
            "1", "2", "--kernel-features", "all", "--out", str(out), "--quiet"]
    line = _assert_one_clean_line(*_stop("build", argv, signal.SIGINT), "SIGINT")
    assert "of 2 kernels are saved in" in line and "run the same command again" in line
    assert "mklscale bank build --dataset breast_cancer" in line
    again = _mklscale(*argv)
    assert again.returncode == 0, again.stderr
    assert "M=2 kernels" in again.stdout
