"""The kernel representation seam (``engine/representation.py``, docs/design.md "Kernel representations"):
no solver module tests which representation an engine has, and a representation no solver knows
plugs in without changing one."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

import mklscale
from mklscale.engine import InMemoryEngine, InMemoryFactorEngine, representation
from mklscale.errors import InvalidInputError
from mklscale.solvers.registry import fit_solver

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _reference import CASES  # noqa: E402

SOLVERS = Path(mklscale.__file__).parent / "solvers"
#: a comparison with a representation's name, or a flag standing for one
TESTS_THE_REPRESENTATION = re.compile(
    r'representation *[!=]=|"(dense|factor)"|is_factor|factored|self\.factor\b|factors is None|\.rank is None')


def test_no_solver_module_tests_the_representation():
    hits = [f"{path.relative_to(SOLVERS.parent)}:{i}: {line.strip()}"
            for path in sorted(SOLVERS.rglob("*.py"))
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if TESTS_THE_REPRESENTATION.search(line)]
    assert not hits, "ask engine.kernel_representation instead:\n" + "\n".join(hits)


def test_of_names_the_known_representations():
    assert representation.of("dense") is representation.DENSE
    assert representation.of("factor") is representation.FACTOR
    with pytest.raises(InvalidInputError, match="unknown kernel representation 'virtual'"):
        representation.of("virtual")


def _recording(base: type) -> representation.Representation:
    """A representation no solver has seen: ``base``'s operations under another name, each method
    asked recorded."""

    class Recording(base):
        name = f"recording-{base.name}"

        def __init__(self):
            self.asked = set()

        def __getattribute__(self, attr):
            value = super().__getattribute__(attr)
            if callable(value) and not attr.startswith("_"):
                object.__getattribute__(self, "asked").add(attr)
            return value

    return Recording()


def _with(engine_cls, rep):
    class Engine(engine_cls):
        @property
        def kernel_representation(self):
            return rep

    return Engine


def _problem(seed: int = 5, n: int = 24, M: int = 6):
    from _banks import subset_gaussian_bank

    grams, y_cls = subset_gaussian_bank(n, M, seed)
    grams /= np.trace(grams, axis1=1, axis2=2)[:, None, None] / n
    y_reg = y_cls * 0.5 + 0.3 * np.random.default_rng(seed).standard_normal(n)
    return grams, y_cls, y_reg


@pytest.mark.parametrize("kind", ["dense", "factor"])
def test_a_new_representation_needs_no_solver_change(kind, monkeypatch):
    """Every solver of the reference cases fits through a representation it has never seen (here
    Dense's or Factor's operations under a new name) with the same bits as through the original."""
    grams, y_cls, y_reg = _problem()
    if kind == "dense":
        stored, engine_cls, base = grams, InMemoryEngine, representation.Dense
    else:
        w, V = np.linalg.eigh(grams)
        stored, engine_cls, base = V * np.sqrt(np.maximum(w, 0.0))[:, None, :], InMemoryFactorEngine, representation.Factor
        from mklscale.solvers.toolkit import lowrank

        monkeypatch.setattr(lowrank, "DENSE_BYTES_CAP", 0)      # the factor code paths
    rep = _recording(base)
    for solver, task, params in CASES:
        y = y_cls if task == "classification" else y_reg
        try:
            plain = fit_solver(solver, engine_cls(stored), y, task, params=dict(params))
        except InvalidInputError:       # a case the representation refuses (e.g. an n x n need on factors)
            with pytest.raises(InvalidInputError):
                fit_solver(solver, _with(engine_cls, rep)(stored), y, task, params=dict(params))
            continue
        seen = fit_solver(solver, _with(engine_cls, rep)(stored), y, task, params=dict(params))
        for field in ("weights", "dual_coef", "bias", "objective"):
            assert np.array_equal(getattr(plain, field), getattr(seen, field), equal_nan=True), (solver, field)
    assert {"choose", "held_matvecs", "held_each_matvec", "newton_backend", "one_blas_thread",
            "held_factor" if kind == "factor" else "optional_dense"} <= rep.asked
