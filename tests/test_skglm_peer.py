"""skglm as the group-lasso peer of SpicyMKL on factor banks (issue 32; benchmarks/peers/skglm_group.py,
benchmarks/bench_skglm.py): on a small factor bank both reach the same optimum of the same problem, and
skglm's own objective (datafit averaged over n, alpha = C / n) is ours divided by n."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("skglm", reason="skglm (the test extra) is not installed: pip install skglm")

from mklscale.engine.memory import InMemoryFactorEngine  # noqa: E402
from mklscale.solvers import spicy  # noqa: E402
from _benchmarks import ROOT, load_module  # noqa: E402


@pytest.fixture(scope="module")
def peer():
    return load_module("skglm_group", ROOT / "benchmarks" / "peers" / "skglm_group.py")


def problem(loss: str, n=300, M=10, r=8, seed=0):
    """Random Fourier factors of Gaussian kernels at M widths (unit trace), and targets."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    L = np.stack([np.cos(s * X @ rng.normal(size=(3, r)) + rng.uniform(0, 2 * np.pi, size=r))
                  for s in np.geomspace(0.2, 4.0, M)])
    L /= np.sqrt(np.einsum("mir,mir->m", L, L))[:, None, None]
    signal = X[:, 0] + np.sin(2 * X[:, 1])
    y = np.where(signal + 0.3 * rng.normal(size=n) > 0, 1.0, -1.0) if loss == "logistic" else \
        signal + 0.1 * rng.normal(size=n)
    return L, y


@pytest.mark.parametrize("loss", ("logistic", "square"))
def test_skglm_reaches_our_optimum(peer, loss):
    L, y = problem(loss)
    engine = InMemoryFactorEngine(L)
    C = 0.1 * spicy.c_max(engine, y, loss)
    ours = spicy.fit(engine, y, C, loss=loss, tol=1e-9, max_outer=500)
    Phi, ptr, idx = peer.group_design(L)
    v, b = peer.solve(Phi, ptr, idx, y, C, loss, tol=1e-10)
    theirs = peer.objective(Phi, ptr, v, b, y, C, loss)
    assert ours.converged and ours.active.size >= 3
    assert theirs == pytest.approx(ours.objective, rel=1e-5)
    assert peer.active_groups(ptr, v) == ours.active.size
    # the scaling: skglm's own objective (its datafit and penalty objects) is P / n
    from skglm.datafits import LogisticGroup, QuadraticGroup
    from skglm.penalties import WeightedGroupL2

    n, M = y.size, L.shape[0]
    datafit = (LogisticGroup if loss == "logistic" else QuadraticGroup)(ptr, idx)
    penalty = WeightedGroupL2(alpha=C / n, weights=np.ones(M), grp_ptr=ptr, grp_indices=idx)
    own = datafit.value(y, v, Phi @ v + b) + penalty.value(v)
    assert n * own == pytest.approx(theirs, rel=1e-12)


@pytest.fixture(scope="module")
def runner():
    return load_module("skglm_run", ROOT / "benchmarks" / "peers" / "skglm_run.py")


@pytest.mark.parametrize("loss", ("logistic", "square"))
def test_progress_lines_give_our_objective(peer, runner, loss, capsys):
    """The objective bench_skglm.py follows in skglm's verbose lines (which it reports when it stops skglm at
    a cap) is P in our units: the last one printed is P at skglm's solution, and the lines the parser takes
    are the outer and inner steps, not other output."""
    L, y = problem(loss)
    engine = InMemoryFactorEngine(L)
    C = 0.1 * spicy.c_max(engine, y, loss)
    Phi, ptr, idx = peer.group_design(L)
    capsys.readouterr()
    v, b = peer.solve(Phi, ptr, idx, y, C, loss, tol=1e-10, verbose=2)
    lines = capsys.readouterr().out.splitlines()
    values = [runner.progress_objective(line, y.size) for line in lines]
    taken = [x for x in values if x is not None]
    inner = "PN iteration" if loss == "logistic" else "Epoch"
    assert len(taken) > sum(line.startswith("Iteration") for line in lines) > 0
    assert any(line.startswith(inner) and x is not None for line, x in zip(lines, values))
    assert taken[-1] == pytest.approx(peer.objective(Phi, ptr, v, b, y, C, loss), rel=1e-8)
    assert runner.progress_objective("Early exit", y.size) is None
