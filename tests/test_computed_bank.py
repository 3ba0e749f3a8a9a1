"""Computed banks (issue 31): kernels computed from the stored features inside every pass, never stored.

A computed bank and a stored bank of the same specs hold the same kernels bit for bit (one function
computes both, ``shards.fill_block``), so every engine operation gives the same bits on both, in
threads and on a cluster of worker processes, except the quad forms, which a computed bank folds
from each kernel's upper triangle as it computes it (equal to rounding, and the same bits on every
pass of its own), and every solver reaches the same result; the computed bank stores the features
and metadata only; its integrity is checked (verify, the passes' checksums); it resumes; the CLI
builds and describes it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from mklscale.bank import KernelBank, build_bank, families
from mklscale.bank.storage.local import disk_usage
from mklscale.cli import main
from mklscale.engine import Engine
from mklscale.errors import BankCorruptError, InvalidInputError
from mklscale.solvers.registry import fit_solver

LAYOUT = dict(chunk_mb=0.2, shard_mb=0.5)  # 120 x 120 float32 kernels: 3 per chunk, 9 per shard


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 8))
    y = np.sign(np.sin(2 * X[:, 0]) + X[:, 1] * X[:, 2] + 0.1 * rng.normal(size=120))
    specs = families.resolve(["per_feature", {"family": "interactions", "pairs": [[1, 2], [3, 4]]}], 8)
    return X, y, specs


@pytest.fixture(scope="module")
def banks(data, tmp_path_factory):
    X, _, specs = data
    folder = tmp_path_factory.mktemp("banks")
    stored = build_bank(X, specs, folder / "stored", progress=False, **LAYOUT)
    computed = build_bank(X, specs, folder / "computed", progress=False, computed=True, **LAYOUT)
    return stored, computed


def test_families_for_feature_selection():
    specs = families.resolve("per_feature", 3)
    assert [s.name for s in specs[:4]] == ["gaussian(width=0.5)[0]", "gaussian(width=1)[0]", "gaussian(width=2)[0]",
                                           "linear()[0]"] and len(specs) == 12
    assert len(families.resolve({"family": "per_feature", "widths": [1.0], "linear": False}, 5)) == 5
    pairs = families.resolve({"family": "interactions", "pairs": [[2, 0]], "widths": [1.0]}, 3)
    assert [s.features for s in pairs] == [(0, 2)]
    assert len(families.resolve({"family": "interactions", "widths": [1.0]}, 4)) == 6  # "all": every pair
    for bad, message in [({"family": "interactions", "pairs": []}, "needs pairs"),
                         ({"family": "interactions", "pairs": [[1, 1]]}, "two different"),
                         ({"family": "per_feature", "linear": "yes"}, "true or false")]:
        with pytest.raises(Exception, match=message):
            families.resolve(bad, 3)


def test_a_computed_bank_holds_the_same_kernels_and_statistics_and_stores_none(banks):
    stored, computed = banks
    assert computed.stores_kernels is False and computed.representation == "computed"
    M = len(stored)
    assert np.array_equal(computed.kernels(range(M)), stored.kernels(range(M)))
    for name in ("trace", "fro", "norm_factor", "checksums"):
        assert np.array_equal(getattr(computed, name), getattr(stored, name)), name
    # lambda_max: the stored bank's Lanczos value (within 1e-8 above the truth), the computed one's a
    # cheaper valid bound (stats.lambda_bound): never below it, within 1.35x here (1 for linear kernels)
    ratio = computed.lambda_max / stored.lambda_max
    assert ratio.min() >= 1 - 2e-8 and ratio.max() <= 1.35, (ratio.min(), ratio.max())
    assert disk_usage(computed.path) < disk_usage(stored.path) / 5
    assert not (computed.path / "gram").exists()
    assert computed.verify().ok
    with pytest.raises(InvalidInputError, match="computed bank"):
        computed.gram
    with pytest.raises(InvalidInputError, match="computed bank"):
        computed.to_xarray()


def test_screening_stays_safe_with_the_stored_bound(banks):
    """Screening on a computed bank (its lambda_max: the bound without an eigensolve) never proves a
    kernel inactive whose norm exceeds the bound: bounds >= the exact norms of the stored kernels for
    vectors near and far from the reference and along each kernel's top eigenvector."""
    from mklscale.solvers.toolkit.screening import Screening

    stored, computed = banks
    K = stored.kernels(range(len(stored))).astype(np.float64)
    rng = np.random.default_rng(2)
    with Engine(computed, threads=2) as engine:
        screen = Screening(engine, engine.lambda_max)
        ref = rng.normal(size=stored.n)
        screen.full_pass(ref)
        tops = np.linalg.eigh(K)[1][:, :, -1]
        for u in [ref + s * rng.normal(size=stored.n) for s in (1e-3, 0.1, 10.0)] + list(ref + 3.0 * tops[::7]):
            true = np.sqrt(np.maximum(np.einsum("i,mij,j->m", u, K, u), 0.0))
            assert np.all(screen.upper_bounds(u) >= true * (1 - 1e-6)), u


def test_every_pass_agrees_and_every_solver_reaches_the_same_result(banks, data):
    stored, computed = banks
    _, y, _ = data
    rng = np.random.default_rng(1)
    U, w = rng.normal(size=(3, stored.n)), rng.random(len(stored))
    with Engine(stored, threads=2) as a, Engine(computed, threads=2) as b:
        for name, op in [("matvecs", lambda e: e.matvecs(U[0])),
                         ("combine", lambda e: e.combine(w)), ("gram_of_kernels", lambda e: e.gram_of_kernels()),
                         ("frobenius", lambda e: e.frobenius(np.eye(stored.n))),
                         ("blocks", lambda e: e.blocks([0, 5, 7]))]:
            assert np.array_equal(op(a), op(b)), name
        first, fused = b.quad_forms(U), b.quad_forms(U)  # kernels checked (whole) on the first pass, then fused
        assert np.array_equal(first, fused)
        stored_q = a.quad_forms(U)
        np.testing.assert_allclose(fused, stored_q, rtol=1e-12, atol=1e-14 * np.abs(stored_q).max())
        each = rng.normal(size=(5, stored.n))
        np.testing.assert_allclose(b.quad_forms(each, [1, 2, 3, 9, 30], per_kernel=True),
                                   a.quad_forms(each, [1, 2, 3, 9, 30], per_kernel=True), rtol=1e-12, atol=1e-14)
        for solver, task in [("spicy", "classification"), ("smo", "classification"), ("pfbs", "regression"),
                             ("gcd", "regression"), ("easymkl", "classification")]:
            ra, rb = fit_solver(solver, a, y, task), fit_solver(solver, b, y, task)
            np.testing.assert_allclose(rb.weights, ra.weights, rtol=1e-9, atol=1e-12 * ra.weights.max(), err_msg=solver)
            assert rb.objective == pytest.approx(ra.objective, rel=1e-12), solver


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("normalize", ["trace", "diag", None])
def test_fused_quad_forms_equal_the_kernels_quad_forms_on_every_family(dtype, normalize, tmp_path):
    """u^T K u folded on the fly from the upper triangle (fused) against the whole computed kernels
    contracted in float64, for every family and sweep: float32 Gaussians on tiles and on a width
    ladder (per_feature), on many features (all-features Gaussians, polynomial kernels), linear
    kernels, feature subsets; shared vectors and one vector per kernel."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(70, 11))
    specs = families.resolve(["per_feature", {"family": "gaussian", "widths": [0.7, 3.0]},
                              {"family": "polynomial", "degrees": [2]},
                              {"family": "interactions", "pairs": [[0, 9]], "widths": [1.0, 4.0]}], 11)
    bank = build_bank(X, specs, tmp_path / "b", progress=False, computed=True, dtype=dtype, normalize=normalize)
    idx = list(range(len(specs)))
    K = bank.compute_kernels(idx).astype(np.float64)
    U, Ue = rng.normal(size=(3, 70)), rng.normal(size=(len(idx), 70))
    scale = np.einsum("ci,mij,cj->mc", np.abs(U), np.abs(K), np.abs(U))
    q = bank.compute_quad_forms(idx, U)
    assert np.all(np.abs(q - np.einsum("ci,mij,cj->mc", U, K, U)) <= 1e-14 * scale)
    qe = bank.compute_quad_forms(idx, Ue, each=True)
    assert np.allclose(qe, np.einsum("mi,mij,mj->m", Ue, K, Ue), rtol=1e-12, atol=1e-13)


def test_pieces_are_whole_groups_of_kernels_sharing_a_base_where_they_fit(banks):
    """A pass's pieces hold whole groups of kernels sharing a base (a feature's widths, computed
    together) when they fit in a piece, so no group's base is computed twice for want of room."""
    from mklscale.engine.computed_tasks import ComputedReader

    _, computed = banks
    reader = ComputedReader(computed, piece_bytes=4 * computed.n ** 2 * 4)  # 4 kernels a piece
    runs = lambda ks: [[int(m) for m in ks[p:p + c]] for p, c in reader._runs(np.asarray(ks))]  # noqa: E731
    assert runs(range(12)) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]  # per_feature: 3 widths, linear
    assert runs(range(2, 13)) == [[2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12]]
    assert runs([0, 1, 5, 6, 7, 8, 9, 10]) == [[0, 1], [5, 6, 7], [8, 9, 10]]
    assert ComputedReader(computed, piece_bytes=1)._runs(np.arange(3)).__next__() == (0, 1)


def test_passes_on_worker_processes_compute_the_same_bits(banks, cluster_client):
    stored, computed = banks
    U = np.random.default_rng(2).normal(size=(2, stored.n))
    with Engine(stored, threads=1) as a, Engine(computed, client=cluster_client) as b, \
            Engine(computed, threads=1) as c:
        assert np.array_equal(b.quad_forms(U), c.quad_forms(U))
        np.testing.assert_allclose(b.quad_forms(U), a.quad_forms(U), rtol=1e-12, atol=1e-14)
        assert np.array_equal(b.matvecs(U[0]), a.matvecs(U[0]))


def test_kernels_computed_differently_from_their_record_are_refused(data, tmp_path):
    X, _, specs = data
    bank = build_bank(X, specs, tmp_path / "c", progress=False, computed=True, **LAYOUT)
    group = KernelBank.open(bank.path, mode="r+").group
    sums = group["checksum"][:]
    sums[4] ^= 1  # the record no longer matches what this mklscale computes for kernel 4
    group["checksum"][:] = sums
    with pytest.raises(BankCorruptError, match="kernel 4 .*computed here from its features"):
        with Engine(KernelBank.open(bank.path), threads=1) as engine:
            engine.quad_forms(np.ones(bank.n))
    report = KernelBank.open(bank.path).verify(mark_bad=False)
    assert 4 in report.bad_indices


def test_a_computed_bank_of_an_older_arithmetic_is_read_with_it(data, tmp_path, monkeypatch):
    """A computed float32 bank created with kernel arithmetic 2 (exp_single) is still read: its kernels
    are computed with the arithmetic it recorded, so they match its checksums and every pass works;
    they differ from this mklscale's (3) by at most a few ulp; resuming it is refused (a build only
    writes the current arithmetic)."""
    from mklscale.bank import _compute, shards
    from mklscale.errors import BankMismatchError

    X, _, specs = data
    with monkeypatch.context() as m:  # the mklscale of arithmetic 2
        m.setattr(_compute, "ARITHMETIC", 2)
        m.setattr(shards.fill_block, "__defaults__", (2,))
        old = build_bank(X, specs, tmp_path / "v2", progress=False, computed=True, **LAYOUT)
    new = build_bank(X, specs, tmp_path / "v3", progress=False, computed=True, **LAYOUT)
    old, new = KernelBank.open(old.path), KernelBank.open(new.path)
    assert old.attrs["arithmetic"] == 2 and new.attrs["arithmetic"] == _compute.ARITHMETIC == 3
    K2, K3 = old.kernels(range(len(specs))), new.kernels(range(len(specs)))
    assert not np.array_equal(K2, K3)
    assert np.abs(K2.view(np.int32).astype(np.int64) - K3.view(np.int32)).max() <= 4  # ulp
    assert old.verify().ok and not np.array_equal(old.checksums, new.checksums)
    with Engine(old, threads=2) as engine:
        q = engine.quad_forms(np.ones(old.n))
    np.testing.assert_allclose(q, np.einsum("mij->m", K2.astype(np.float64)), rtol=1e-6)
    group = KernelBank.open(old.path, mode="r+").group
    flags = group["complete"][:]
    flags[3] = False
    group["complete"][:] = flags
    with pytest.raises(BankMismatchError, match="arithmetic version 2.*overwrite=True"):
        build_bank(X, specs, old.path, progress=False, computed=True, **LAYOUT)


def test_a_computed_build_resumes_and_is_never_mixed_with_a_stored_one(data, tmp_path):
    X, _, specs = data
    bank = build_bank(X, specs, tmp_path / "c", progress=False, computed=True, **LAYOUT)
    group = KernelBank.open(bank.path, mode="r+").group
    flags = group["complete"][:]
    flags[10:20] = False  # as if the build had stopped there
    group["complete"][:] = flags
    resumed = build_bank(X, specs, tmp_path / "c", progress=False, computed=True, **LAYOUT)
    assert resumed.complete.all() and resumed.last_build_computed == 18  # the two shards holding 10..19
    with pytest.raises(Exception, match="different data, kernel specs or settings"):
        build_bank(X, specs, tmp_path / "c", progress=False, **LAYOUT)  # a stored bank over a computed one
    with pytest.raises(InvalidInputError, match="computed=True .*rank"):
        build_bank(X, specs, tmp_path / "f", progress=False, computed=True, rank=8)


def test_the_cli_builds_and_describes_a_computed_bank(data, tmp_path, capsys):
    X, _, _ = data
    np.save(tmp_path / "X.npy", X)
    out = tmp_path / "bank"
    assert main(["bank", "build", "--features", str(tmp_path / "X.npy"), "--family", "per_feature", "--widths", "1",
                 "--linear", "no", "--computed", "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["bank", "info", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["representation"] == "computed" and info["M"] == 8 and info["complete"] == 8
    assert main(["bank", "info", str(out)]) == 0
    assert "computed (no kernel stored" in capsys.readouterr().out
    assert main(["bank", "verify", str(out)]) == 0


def test_a_pipeline_on_a_computed_bank_gives_the_stored_banks_results(tmp_path):
    from mklscale.pipeline import run_pipeline

    results = {}
    for computed in ("false", "true"):
        spec = tmp_path / f"p{computed}.toml"
        spec.write_text(f'name = "sel"\nseed = 1\n[dataset]\nname = "breast_cancer"\nmax_train = 120\n[bank]\n'
                        f'family = "per_feature"\nwidths = [1.0]\ncomputed = {computed}\n[[solver]]\nname = "spicy"\n'
                        'solver = "spicy"\nC = 0.5\n[report]\nenabled = false\n')
        results[computed] = run_pipeline(spec, out=tmp_path / f"run{computed}", quiet=True,
                                         cluster={"kind": "local", "n_workers": 1, "processes": False})
    assert results["true"]["bank"]["representation"] == "computed"
    stored, computed = (results[k]["solvers"][0] for k in ("false", "true"))
    assert stored["metrics"] == computed["metrics"] and stored["kernels"] == computed["kernels"]

