"""The SpicyMKL plug-in pieces: losses and penalties checked against their definitions.

Each formula is compared with an independent numerical evaluation of its definition (finite
differences, scalar minimisation of a sup/argmin/envelope) or an identity that must hold exactly
(Fenchel-Young equality, Moreau's identity).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize_scalar

from mklscale.errors import InvalidInputError
from mklscale.solvers.losses import EpsInsensitive, Hinge, Logistic, Square, make_loss
from mklscale.solvers.penalties import L1, BlockQ, ElasticNet, make_penalty

RNG = np.random.default_rng(20240601)
LABELS = np.array([1.0, -1.0, 1.0, -1.0, 1.0, 1.0])
TARGETS = np.array([0.3, -1.2, 2.0, 0.05, -0.4, 1.1])

LOSS_CASES = [
    (Logistic(), LABELS),
    (Hinge(), LABELS),
    (Square(), TARGETS),
    (EpsInsensitive(0.1), TARGETS),
]
LOSS_IDS = [loss.name for loss, _ in LOSS_CASES]

PENALTY_CASES = [L1(), ElasticNet(0.3), ElasticNet(1.0), BlockQ(1.5), BlockQ(2.0), BlockQ(3.0)]
PENALTY_IDS = ["l1", "en0.3", "en1", "q1.5", "q2", "q3"]
C_VALUES = (0.7, 2.5)


def _interior_dual(loss, y):
    """A random rho strictly inside the domain of L*(-.), away from kinks."""
    lo, hi = loss.dual_bounds(y)
    lo = np.where(np.isfinite(lo), lo, -3.0)
    hi = np.where(np.isfinite(hi), hi, 3.0)
    t = RNG.uniform(0.15, 0.85, size=y.size)
    rho = lo + t * (hi - lo)
    if loss.name == "eps_insensitive":  # keep |rho| away from the kink at 0
        rho = np.where(np.abs(rho) < 0.1, 0.3, rho)
    return rho


# ----------------------------------------------------------------------------------------- losses

@pytest.mark.parametrize("loss,y", LOSS_CASES, ids=LOSS_IDS)
def test_loss_gradient_matches_finite_differences(loss, y):
    f = RNG.normal(size=y.size) * 2.0
    if loss.name in ("hinge", "eps_insensitive"):  # stay off the kinks
        f = np.where(np.abs(y * f - 1.0) < 0.05, f + 0.2, f)
        f = np.where(np.abs(np.abs(f - y) - 0.1) < 0.05, f + 0.2, f)
    h = 1e-6
    for i in range(y.size):
        e = np.zeros_like(f)
        e[i] = h
        fd = (loss.value(y, f + e) - loss.value(y, f - e)) / (2 * h)
        assert loss.grad(y, f)[i] == pytest.approx(fd, rel=1e-6, abs=1e-8)


@pytest.mark.parametrize("loss,y", LOSS_CASES, ids=LOSS_IDS)
def test_loss_conjugate_equals_its_definition(loss, y):
    """h(rho) = L*(-rho) = sum_i sup_z (-rho_i z - loss(y_i, z)), by scalar maximisation."""
    rho = _interior_dual(loss, y)
    numeric = 0.0
    for yi, ri in zip(y, rho):
        res = minimize_scalar(lambda z: ri * z + loss.value(np.array([yi]), np.array([z])),
                              bounds=(-60.0, 60.0), method="bounded", options={"xatol": 1e-11})
        numeric += -res.fun
    assert loss.conjugate(y, rho) == pytest.approx(numeric, rel=1e-6, abs=1e-7)


@pytest.mark.parametrize("loss,y", LOSS_CASES, ids=LOSS_IDS)
def test_conjugate_gradient_and_hessian_match_finite_differences(loss, y):
    rho = _interior_dual(loss, y)
    h = 1e-6
    grad, hess = loss.conjugate_grad(y, rho), loss.conjugate_hess(y, rho)
    for i in range(y.size):
        e = np.zeros_like(rho)
        e[i] = h
        fd_grad = (loss.conjugate(y, rho + e) - loss.conjugate(y, rho - e)) / (2 * h)
        fd_hess = (loss.conjugate_grad(y, rho + e)[i] - loss.conjugate_grad(y, rho - e)[i]) / (2 * h)
        assert grad[i] == pytest.approx(fd_grad, rel=1e-5, abs=1e-7)
        assert hess[i] == pytest.approx(fd_hess, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("loss,y", LOSS_CASES, ids=LOSS_IDS)
def test_fenchel_young_equality_at_primal_dual_pair(loss, y):
    """L(f) + L*(-rho) = -rho^T f when rho = -loss'(f) (the paper's sign convention)."""
    f = RNG.normal(size=y.size)
    if loss.name in ("hinge", "eps_insensitive"):
        f = np.where(np.abs(y * f - 1.0) < 0.05, f + 0.2, f)
        f = np.where(np.abs(np.abs(f - y) - 0.1) < 0.05, f + 0.2, f)
    rho = -loss.grad(y, f)
    assert loss.value(y, f) + loss.conjugate(y, rho) == pytest.approx(-rho @ f, rel=1e-10, abs=1e-10)
    # and -grad h(rho) recovers f where h is differentiable with an invertible gradient
    if loss.name in ("logistic", "square"):
        np.testing.assert_allclose(-loss.conjugate_grad(y, rho), f, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("loss,y", LOSS_CASES, ids=LOSS_IDS)
def test_domain_outside_is_infinite_and_clip_brings_it_back(loss, y):
    lo, hi = loss.dual_bounds(y)
    rho = _interior_dual(loss, y)
    assert np.isfinite(loss.conjugate(y, rho)) and loss.in_domain(y, rho)
    if np.all(np.isfinite(hi)):
        outside = rho.copy()
        outside[0] = hi[0] + 0.1
        assert loss.conjugate(y, outside) == np.inf
        assert not loss.in_domain(y, outside)
        clipped = loss.clip_to_domain(y, outside)
        assert clipped[0] == hi[0] and np.isfinite(loss.conjugate(y, clipped))
    else:
        assert loss.in_domain(y, rho * 100.0)
    assert loss.in_domain(y, loss.initial_dual(y))


def test_loss_conventions():
    y, f = np.array([1.0, -1.0]), np.array([0.5, 0.5])
    assert Square().value(np.array([2.0]), np.array([0.0])) == pytest.approx(2.0)  # (1/2)(y-f)^2
    assert Logistic().value(y, f) == pytest.approx(np.log1p(np.exp(-0.5)) + np.log1p(np.exp(0.5)))
    assert Hinge().value(y, f) == pytest.approx(0.5 + 1.5)
    assert EpsInsensitive(0.25).value(np.array([1.0, 1.0]), np.array([1.2, 2.0])) == pytest.approx(0.75)
    # logistic conjugate at the boundary is finite (0 log 0 = 0): the dual can be evaluated there
    assert Logistic().conjugate(y, np.array([1.0, 0.0])) == pytest.approx(0.0)


def test_loss_factory_and_bad_parameters():
    assert make_loss("eps_insensitive", eps=0.3).eps == 0.3
    with pytest.raises(InvalidInputError, match="unknown loss"):
        make_loss("huber")
    with pytest.raises(InvalidInputError, match="eps"):
        EpsInsensitive(-0.1)
    with pytest.raises(InvalidInputError, match="eps"):
        EpsInsensitive(float("nan"))


# -------------------------------------------------------------------------------------- penalties

@pytest.mark.parametrize("penalty", PENALTY_CASES, ids=PENALTY_IDS)
@pytest.mark.parametrize("C", C_VALUES)
def test_prox_is_the_minimiser(penalty, C):
    for v in (0.0, 0.05, 0.5, 1.3, 4.0, 17.0):
        res = minimize_scalar(lambda x: penalty.value(x, C) + 0.5 * (x - v) ** 2,
                              bounds=(0.0, v + 1.0), method="bounded", options={"xatol": 1e-12})
        assert penalty.prox(np.array([v]), C)[0] == pytest.approx(res.x, abs=1e-7)


@pytest.mark.parametrize("penalty", PENALTY_CASES, ids=PENALTY_IDS)
@pytest.mark.parametrize("C", C_VALUES)
def test_prox_derivative_matches_finite_differences(penalty, C):
    thr = penalty.threshold(C)
    v = np.array([0.3, 1.1, 2.9, 6.0]) + thr
    v = v[np.abs(v - thr) > 1e-3]
    h = 1e-6
    fd = (penalty.prox(v + h, C) - penalty.prox(v - h, C)) / (2 * h)
    np.testing.assert_allclose(penalty.prox_derivative(v, C), fd, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("penalty", PENALTY_CASES, ids=PENALTY_IDS)
@pytest.mark.parametrize("C", C_VALUES)
def test_penalty_conjugate_equals_its_definition(penalty, C):
    """g~_C*(y) = sup_{x >= 0} x y - g~_C(x) by scalar maximisation (finite part of the domain)."""
    for y in (0.0, 0.2, 0.6, 1.0, 2.2, 5.0):
        value = penalty.conjugate(np.array([y]), C)[0]
        if penalty.name == "l1" and y > C:
            assert value == np.inf
            continue
        res = minimize_scalar(lambda x: -(x * y - penalty.value(x, C)), bounds=(0.0, 200.0),
                              method="bounded", options={"xatol": 1e-12})
        assert value == pytest.approx(-res.fun, rel=1e-7, abs=1e-8)


@pytest.mark.parametrize("penalty", PENALTY_CASES[1:], ids=PENALTY_IDS[1:])
@pytest.mark.parametrize("C", C_VALUES)
def test_conjugate_derivatives_match_finite_differences(penalty, C):
    y = np.array([0.4, 1.3, 2.7, 5.5])
    y = y[np.abs(y - penalty.threshold(C)) > 1e-3]
    h = 1e-6
    d1 = (penalty.conjugate(y + h, C) - penalty.conjugate(y - h, C)) / (2 * h)
    d2 = (penalty.conjugate_derivative(y + h, C) - penalty.conjugate_derivative(y - h, C)) / (2 * h)
    np.testing.assert_allclose(penalty.conjugate_derivative(y, C), d1, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(penalty.conjugate_second_derivative(y, C), d2, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("penalty", PENALTY_CASES, ids=PENALTY_IDS)
@pytest.mark.parametrize("C", C_VALUES)
def test_fenchel_young_equality(penalty, C):
    """g~_C(x) + g~_C*(y) = x y at y = g~_C'(x) (x > 0)."""
    h = 1e-6
    for x in (0.3, 1.0, 2.5):
        slope = (penalty.value(x + h, C) - penalty.value(x - h, C)) / (2 * h)
        lhs = penalty.value(x, C) + penalty.conjugate(np.array([slope]), C)[0]
        if penalty.name == "l1":  # y = C is the edge of the indicator's domain
            slope = C
            lhs = penalty.value(x, C) + penalty.conjugate(np.array([C]), C)[0]
        assert lhs == pytest.approx(x * slope, rel=1e-7)


@pytest.mark.parametrize("penalty", PENALTY_CASES, ids=PENALTY_IDS)
@pytest.mark.parametrize("C", C_VALUES)
def test_ghat_is_the_moreau_envelope_and_its_derivative_is_the_prox(penalty, C):
    for y in (0.0, 0.3, 0.9, 1.7, 3.0, 8.0):
        upper = min(y + 1.0, C) if penalty.name == "l1" else y + 1.0  # dom g~_C* = [0, C] for l1
        def objective(yp):
            return penalty.conjugate(np.array([yp]), C)[0] + 0.5 * (yp - y) ** 2

        res = minimize_scalar(objective, bounds=(0.0, upper), method="bounded", options={"xatol": 1e-12})
        best = min(res.fun, objective(0.0), objective(upper))  # Brent never evaluates the ends
        assert penalty.ghat(np.array([y]), C)[0] == pytest.approx(best, rel=1e-7, abs=1e-9)
        # Moreau's identity: d ghat / dy = prox of g~_C at y
        if y > 0:
            h = 1e-6
            fd = (penalty.ghat(np.array([y + h]), C) - penalty.ghat(np.array([y - h]), C))[0] / (2 * h)
            assert fd == pytest.approx(penalty.prox(np.array([y]), C)[0], rel=1e-6, abs=1e-8)


def test_closed_forms_of_the_note():
    C, lam = 1.7, 0.35
    en = ElasticNet(lam)
    y = np.array([0.2, 1.5, 3.0])
    np.testing.assert_allclose(en.ghat(y, C), np.maximum(y - C * (1 - lam), 0) ** 2 / (2 * (1 + C * lam)))
    np.testing.assert_allclose(en.conjugate(y, C), np.maximum(y - C * (1 - lam), 0) ** 2 / (2 * C * lam))
    np.testing.assert_allclose(L1().ghat(y, C), np.maximum(y - C, 0) ** 2 / 2)
    bq = BlockQ(1.5)
    r = 3.0
    np.testing.assert_allclose(bq.conjugate(y, C), C ** (1 - r) * y**r / r)


@pytest.mark.parametrize("penalty", PENALTY_CASES, ids=PENALTY_IDS)
def test_weight_is_table3_and_links_alpha_to_rho(penalty):
    """d = 1/(2 g'(x^2)) with g(s) = g~(sqrt(s)); equivalently x / g~_C'(x) = d / C, which is what
    makes alpha_m = d_m rho / C at the optimum."""
    C, h = 1.3, 1e-7
    x = np.array([0.2, 1.0, 3.0])

    def g(s):
        return penalty.value(np.sqrt(s), 1.0)

    g_prime = (g(x**2 + h) - g(x**2 - h)) / (2 * h)
    np.testing.assert_allclose(penalty.weight(x), 1.0 / (2.0 * g_prime), rtol=1e-6)
    slope_C = (penalty.value(x + h, C) - penalty.value(x - h, C)) / (2 * h)
    np.testing.assert_allclose(x / slope_C, penalty.weight(x) / C, rtol=1e-6)
    assert penalty.weight(np.array([0.0]))[0] == 0.0


def test_thresholds_give_exact_sparsity():
    C = 0.8
    for penalty, thr in ((L1(), C), (ElasticNet(0.25), 0.75 * C), (BlockQ(1.5), 0.0)):
        assert penalty.threshold(C) == pytest.approx(thr)
        assert penalty.ghat(np.array([thr]), C)[0] == 0.0
        assert penalty.prox(np.array([thr]), C)[0] == 0.0
        assert penalty.ghat(np.array([thr + 1e-3]), C)[0] > 0.0
    assert ElasticNet(1.0).weight(np.array([0.01, 5.0])).tolist() == [1.0, 1.0]  # uniform weights
    assert ElasticNet(0.0).smooth_conjugate is False and ElasticNet(0.2).smooth_conjugate is True


def test_penalty_factory_and_bad_parameters():
    assert isinstance(make_penalty("l1"), L1)
    assert make_penalty("elastic_net", lam=0.2).lam == 0.2
    assert make_penalty("block_q", q=1.8).q == 1.8
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(InvalidInputError, match="lam"):
            make_penalty("elastic_net", lam=bad)
    for bad in (1.0, 0.5, -2.0, float("inf")):
        with pytest.raises(InvalidInputError, match="q"):
            make_penalty("block_q", q=bad)
    with pytest.raises(InvalidInputError, match="unknown penalty"):
        make_penalty("group_lasso")
