"""First run and everyday use: the version, what ``dir`` and ``help`` show, the reason a missing
``predict_proba`` gives, and that the README's examples write nothing into the repository's
tracked tree."""

from __future__ import annotations

import inspect
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mklscale
from mklscale import MKLClassifier, MKLRegressor

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mklscale", *args], capture_output=True, text=True, timeout=120,
                          **kwargs)


def test_version_flag_prints_the_package_version():
    r = _cli("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"mklscale {mklscale.__version__}"


def test_dir_lists_the_lazily_imported_names():
    assert set(mklscale.__all__) <= set(dir(mklscale))


@pytest.mark.parametrize("cls", [MKLClassifier, MKLRegressor])
def test_help_documents_every_parameter_numpydoc_style(cls):
    """The class docstring (what help() shows) has a numpydoc Parameters section with one
    ``name : type`` entry per constructor parameter, in the signature's order."""
    doc = inspect.getdoc(cls)
    match = re.search(r"^Parameters\n-{10}\n(.*?)(?=^\w[\w ]*\n-{3,}\n|\Z)", doc, re.S | re.M)
    assert match, doc
    entries = re.findall(r"^(\w+) : \S", match.group(1), re.M)
    assert entries == list(inspect.signature(cls).parameters)
    assert "Attributes\n----------" in doc


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 3))
    return X, np.where(X[:, 0] + 0.3 * rng.normal(size=30) > 0, 1, -1), tmp_path_factory.mktemp("cache")


@pytest.mark.parametrize("solver, params, used", [("uniform", None, "solver='uniform'"),
                                                  ("spicy", {"loss": "hinge"}, "solver='spicy' with loss='hinge'")])
def test_missing_predict_proba_says_which_solver_and_loss_give_probabilities(toy, solver, params, used):
    X, y, cache = toy
    est = MKLClassifier(kernels={"family": "gaussian", "widths": [1.0], "features": "all"}, solver=solver,
                        solver_params=params, cache_dir=cache).fit(X, y)
    assert not hasattr(est, "predict_proba") and not hasattr(est, "predict_log_proba")
    for method in ("predict_proba", "predict_log_proba"):
        with pytest.raises(AttributeError) as excinfo:
            getattr(est, method)(X)
        text = str(excinfo.value)
        assert text.startswith(f"This 'MKLClassifier' has no attribute '{method}': ")
        assert "available only for solver='spicy' with loss='logistic'" in text and used in text


def _readme_outputs() -> list[str]:
    """The paths the README's examples write: ``--out PATH``, ``.save("PATH")`` and banks."""
    text = (ROOT / "README.md").read_text()
    found = re.findall(r"--out[ =](\S+)", text) + re.findall(r"\.save\(\"([^\"]+)\"\)", text)
    found += [f"{bank}/" for bank in re.findall(r"build_bank\([^)]*?\"([^\"]+)\"", text)]  # a bank is a folder
    return sorted({p for p in found if not p.startswith("$") and "=" not in p})


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
def test_readme_examples_write_only_ignored_paths():
    outputs = _readme_outputs()
    assert {"runs/model/", "runs/predictions.csv", "bank.zarr/"} <= set(outputs), outputs
    r = subprocess.run(["git", "check-ignore", "--no-index", "--verbose", "--non-matching", *outputs], cwd=ROOT,
                       capture_output=True, text=True)
    not_ignored = [line.split("\t")[-1] for line in r.stdout.splitlines() if line.startswith("::")]
    assert not not_ignored, f"README examples write into the tracked tree: {not_ignored}"


def test_report_command_prints_the_report_path_once(tmp_path, capsys):
    from mklscale.cli import main

    (tmp_path / "results.json").write_text('{"schema_version": 1, "solvers": [{"name": "bare"}]}')
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    index = tmp_path / "report" / "index.html"
    assert index.is_file() and out.count(str(index)) == 1 and len(out.splitlines()) == 1, out


# ---- numba's first compilation is announced ----------------------------------------------------------
_JITTED = "import numba\n\n\n@numba.njit(cache=True)\ndef plus_one(x):\n    return x + 1\n"


def _jit_state(folder: Path, env: dict, call: bool) -> bool:
    """will_compile([plus_one]) in a fresh interpreter (then call it, writing numba's cache, if ``call``)."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import jitted; from mklscale.runtime.jit import will_compile; "
            "print(will_compile([jitted.plus_one])); jitted.plus_one(1) if sys.argv[2] == '1' else None")
    r = subprocess.run([sys.executable, "-c", code, str(folder), "1" if call else "0"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip() == "True"


def test_will_compile_reads_numbas_disk_cache(tmp_path, monkeypatch):
    """True before the first call writes the cache, False after, True again once the source changes."""
    import os

    (tmp_path / "jitted.py").write_text(_JITTED)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), "PYTHONPATH": os.pathsep.join(sys.path)}
    assert _jit_state(tmp_path, env, call=False) is True   # looking compiles nothing
    assert _jit_state(tmp_path, env, call=True) is True
    assert _jit_state(tmp_path, env, call=False) is False
    (tmp_path / "jitted.py").write_text(_JITTED + "\n# edited\n")
    assert _jit_state(tmp_path, env, call=False) is True


def _build_stderr(tmp_path: Path, env: dict, stop_at: str | None) -> str:
    """stderr of `mklscale bank build` on 12 rows, read until ``stop_at`` appears (then the build is killed)."""
    import os

    X = tmp_path / "X.npy"
    np.save(X, np.random.default_rng(0).normal(size=(12, 2)))
    out = tmp_path / f"bank-{len(list(tmp_path.glob('bank-*')))}"
    proc = subprocess.Popen([sys.executable, "-m", "mklscale", "bank", "build", "--features", str(X), "--family",
                             "gaussian", "--widths", "1", "--kernel-features", "all", "--out", str(out)],
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=env)
    seen = b""
    try:
        while chunk := os.read(proc.stderr.fileno(), 4096):
            seen += chunk
            if stop_at is not None and stop_at.encode() in seen:
                break
    finally:
        proc.kill()
        proc.wait(timeout=60)
        proc.stderr.close()
    return seen.decode(errors="replace")


def test_build_bar_says_compiling_only_when_numba_will_compile(tmp_path):
    import os

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    cold = _build_stderr(tmp_path, {**env, "NUMBA_CACHE_DIR": str(tmp_path / "cold-numba")},
                         stop_at="build bank: compiling kernels (first run only)")
    assert "build bank: compiling kernels (first run only)" in cold, cold
    _build_stderr(tmp_path, env, stop_at=None)  # this checkout's own cache: compiled now at the latest
    warm = _build_stderr(tmp_path, env, stop_at=None)
    assert "build bank" in warm and "compiling" not in warm, warm
