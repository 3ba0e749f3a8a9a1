"""Numba kernels of SMO-MKL (Bach, Lanckriet & Jordan 2004): G(alpha) of the Moreau-Yosida regularised
support kernel machine, its gradient weights, and the SMO inner loop. See ``smo.py`` for the problem.

Notation (per kernel l of the working set): q_l = alpha^T D(y) K_l D(y) alpha, d_l and a_l the SKM
and MY parameters, gamma_l = sqrt(q_l) / d_l, w_l = d_l^2 / a_l^2.

Figure 3 / Appendix C:
    gamma(alpha) = argmin_g (1/2) g^2 + (1/2) sum_l w_l max(0, gamma_l - g)^2
                 = v / (u + 1), u = sum_{l in S} w_l, v = sum_{l in S} w_l gamma_l over the top set S,
    found by adding kernels in decreasing gamma_l until -(u + 1) gamma_next + v > 0 (gamma_{j0} = 0;
    at alpha = 0 every gamma_l = 0, the test never fires and gamma = 0).
    G(alpha) = (1/2) gamma^2 + (1/2) sum_l w_l max(0, gamma_l - gamma)^2 - e^T alpha
    eta_l = (1/a_l^2)(1 - gamma/gamma_l) if gamma_l >= gamma (and gamma_l > 0), else 0
    grad G = sum_l eta_l D(y) K_l D(y) alpha - e, i.e. y_i (grad G)_i = sum_l eta_l z_li - y_i with
    z_l = K_l D(y) alpha (cached for every kernel of the working set).
    eta~_l = eta_l / (1 - a_l^2 eta_l), and sum_l d_l^2 eta~_l = 1 (Appendix B).

SMO step on the pair (i, j) (direction alpha_i -= y_i t, alpha_j += y_j t, keeps y^T alpha; [DERIVED]):
    q_l(t) = q_l + 2 t Delta_l + t^2 H_l, Delta_l = z_lj - z_li, H_l = K_l,ii + K_l,jj - 2 K_l,ij
    phi(t) = G(alpha(t)),  phi'(t) = sum_l eta_l(t) (Delta_l + t H_l) + y_i - y_j
    phi is convex and C^1, phi'(0) = y_j gradG_j - y_i gradG_i < 0 for a violating pair, so the
    line search is the root of phi' on [0, t_max], found by Brent's method (Brent 1973, the zeroin
    algorithm of scipy.optimize.brentq), or t_max when phi'(t_max) <= 0.
Representations: every function reading kernel entries takes the stored blocks B and ``factor``:
dense B (p, n, n) holds K_l; factor B (p, n, r) holds L_l with K_l = L_l L_l^T, whose entries are
<L_l[i], L_l[j]> (O(r)) and columns L_l L_l[i] (O(n r), cached in ``smo_solve``). Everything else
(z_l, q_l, eta, the gradient, the line search) is the same for both.
Working set: maximal violating pair on OPT_6 with the index sets as corrected in NOTES-pfbs-smo.md:
    i = argmax_{I_M u I_0- u I_C+} y_i gradG_i,  j = argmin_{I_M u I_0+ u I_C-} y_j gradG_j,
    stop when the difference is <= 2 eps.
"""

from __future__ import annotations

import numpy as np
from numba import njit

BRENT_MAX_ITER = 200
SMO_CONVERGED, SMO_MAX_STEPS, SMO_STALLED = 0, 1, 2
SMO_STATUS = {SMO_CONVERGED: "converged", SMO_MAX_STEPS: "max_steps", SMO_STALLED: "stalled"}
REFRESH_EVERY = 64


@njit(cache=True)
def my_gamma(gammas, w):
    """gamma(alpha) of Figure 3 for gamma_l = ``gammas`` and w_l = d_l^2 / a_l^2."""
    p = gammas.size
    order = np.argsort(gammas)
    u = 0.0
    v = 0.0
    for k in range(p - 1, -1, -1):
        jk = order[k]
        u += w[jk]
        v += w[jk] * gammas[jk]
        prev = gammas[order[k - 1]] if k > 0 else 0.0
        if v - (u + 1.0) * prev > 0.0:
            break
    return v / (u + 1.0)


@njit(cache=True)
def kernel_gammas(q, d, out):
    """out_l = sqrt(max(q_l, 0)) / d_l."""
    for l in range(q.size):
        out[l] = np.sqrt(max(q[l], 0.0)) / d[l]


@njit(cache=True)
def my_weights(gammas, gamma, a, out):
    """eta_l = (1/a_l^2)(1 - gamma/gamma_l) for gamma_l >= gamma, gamma_l > 0; else 0."""
    for l in range(gammas.size):
        g = gammas[l]
        if g > 0.0 and g >= gamma:
            out[l] = (1.0 - gamma / g) / (a[l] * a[l])
        else:
            out[l] = 0.0


@njit(cache=True)
def my_value(q, d, a, sum_alpha):
    """G(alpha) from the quadratic forms q (Figure 3)."""
    p = q.size
    gammas = np.empty(p)
    kernel_gammas(q, d, gammas)
    w = (d / a) ** 2
    gamma = my_gamma(gammas, w)
    total = 0.5 * gamma * gamma
    for l in range(p):
        excess = gammas[l] - gamma
        if excess > 0.0:
            total += 0.5 * w[l] * excess * excess
    return total - sum_alpha


@njit(cache=True)
def _line_derivative(t, q, delta, curv, d, a, w, dy, gammas, eta, qt):
    """phi'(t) = sum_l eta_l(t) (Delta_l + t H_l) + y_i - y_j (dy = y_i - y_j)."""
    for l in range(q.size):
        qt[l] = q[l] + t * (2.0 * delta[l] + t * curv[l])
    kernel_gammas(qt, d, gammas)
    gamma = my_gamma(gammas, w)
    my_weights(gammas, gamma, a, eta)
    total = dy
    for l in range(q.size):
        total += eta[l] * (delta[l] + t * curv[l])
    return total


@njit(cache=True)
def line_search(q, delta, curv, d, a, dy, t_max):
    """argmin_{t in [0, t_max]} phi(t) for the convex C^1 phi above: t_max if phi'(t_max) <= 0, else
    the root of phi' by Brent's method (scipy.optimize.brentq's algorithm, xtol = 4 eps t_max)."""
    p = q.size
    w = (d / a) ** 2
    gammas = np.empty(p)
    eta = np.empty(p)
    qt = np.empty(p)
    f_hi = _line_derivative(t_max, q, delta, curv, d, a, w, dy, gammas, eta, qt)
    if f_hi <= 0.0:
        return t_max
    f_lo = _line_derivative(0.0, q, delta, curv, d, a, w, dy, gammas, eta, qt)
    if f_lo >= 0.0:
        return 0.0
    xtol = 4.0 * 2.220446049250313e-16 * t_max
    rtol = 4.0 * 2.220446049250313e-16
    xpre, xcur = 0.0, t_max
    fpre, fcur = f_lo, f_hi
    xblk, fblk, spre, scur = 0.0, 0.0, 0.0, 0.0
    for _ in range(BRENT_MAX_ITER):
        if fpre * fcur < 0.0:
            xblk, fblk = xpre, fpre
            spre = scur = xcur - xpre
        if abs(fblk) < abs(fcur):
            xpre, xcur, xblk = xcur, xblk, xcur
            fpre, fcur, fblk = fcur, fblk, fcur
        delta_tol = 0.5 * (xtol + rtol * abs(xcur))
        sbis = 0.5 * (xblk - xcur)
        if fcur == 0.0 or abs(sbis) < delta_tol:
            break
        if abs(spre) > delta_tol and abs(fcur) < abs(fpre):
            if xpre == xblk:  # secant
                stry = -fcur * (xcur - xpre) / (fcur - fpre)
            else:  # inverse quadratic interpolation
                dpre = (fpre - fcur) / (xpre - xcur)
                dblk = (fblk - fcur) / (xblk - xcur)
                stry = -fcur * (fblk * dblk - fpre * dpre) / (dblk * dpre * (fblk - fpre))
            if 2.0 * abs(stry) < min(abs(spre), 3.0 * abs(sbis) - delta_tol):
                spre, scur = scur, stry
            else:
                spre, scur = sbis, sbis
        else:
            spre, scur = sbis, sbis
        xpre, fpre = xcur, fcur
        if abs(scur) > delta_tol:
            xcur += scur
        else:
            xcur += delta_tol if sbis > 0.0 else -delta_tol
        fcur = _line_derivative(xcur, q, delta, curv, d, a, w, dy, gammas, eta, qt)
    return min(max(xcur, 0.0), t_max)


@njit(cache=True)
def scaled_gradient(Z, y, eta, out):
    """out_i = y_i (grad G)_i = sum_l eta_l z_li - y_i."""
    p, n = Z.shape
    for i in range(n):
        out[i] = -y[i]
    for l in range(p):
        e = eta[l]
        if e != 0.0:
            for i in range(n):
                out[i] += e * Z[l, i]


@njit(cache=True)
def violating_pair(g, y, alpha, C):
    """(i, j, g_i - g_j) with i = argmax g over I_M u I_0- u I_C+ ("low" set) and j = argmin g over
    I_M u I_0+ u I_C- ("up" set); i = j = -1 when a set is empty."""
    i_best, j_best = -1, -1
    g_max, g_min = -np.inf, np.inf
    for k in range(g.size):
        a = alpha[k]
        free = a > 0.0 and a < C
        if free or (a <= 0.0 and y[k] < 0.0) or (a >= C and y[k] > 0.0):
            if g[k] > g_max:
                g_max, i_best = g[k], k
        if free or (a <= 0.0 and y[k] > 0.0) or (a >= C and y[k] < 0.0):
            if g[k] < g_min:
                g_min, j_best = g[k], k
    return i_best, j_best, g_max - g_min


@njit(cache=True)
def _weights_and_gradient(Z, y, q, d, a, w, gammas, eta, g):
    kernel_gammas(q, d, gammas)
    my_weights(gammas, my_gamma(gammas, w), a, eta)
    scaled_gradient(Z, y, eta, g)


@njit(cache=True)
def _exact_forms(Z, y, alpha, q):
    p, n = Z.shape
    for l in range(p):
        acc = 0.0
        for k in range(n):
            acc += y[k] * alpha[k] * Z[l, k]
        q[l] = acc


@njit(cache=True, fastmath={"reassoc", "contract", "nsz"})
def _factor_column(L, x, out):
    """out = L x for one factor L (n, r) (entries widened to float64): a column L L_i of K = L L^T.
    The sum over r is reassociated so that it vectorises: it is the O(n r) part of a factor step."""
    n, r = L.shape
    for k in range(n):
        acc = 0.0
        for c in range(r):
            acc += np.float64(L[k, c]) * x[c]
        out[k] = acc


@njit(cache=True, fastmath={"reassoc", "contract", "nsz"})
def _factor_columns2(L, x1, x2, out1, out2):
    """out1 = L x1 and out2 = L x2 in one read of L (two cache misses of a step); each sum is the
    same as :func:`_factor_column`'s (same loop per output), so the columns do not depend on which
    other column was missing."""
    n, r = L.shape
    for k in range(n):
        acc1 = 0.0
        acc2 = 0.0
        for c in range(r):
            v = np.float64(L[k, c])
            acc1 += v * x1[c]
            acc2 += v * x2[c]
        out1[k] = acc1
        out2[k] = acc2


@njit(cache=True)
def _claim_slot(i, slot_of, owner, stamp, have, protect):
    """A slot for index i: the least recently used one other than ``protect``, emptied."""
    s = -1
    for c in range(owner.size):
        if c != protect and (s < 0 or stamp[c] < stamp[s]):
            s = c
    if owner[s] >= 0:
        slot_of[owner[s]] = -1
    owner[s] = i
    slot_of[i] = s
    have[s, :] = False
    return s


@njit(cache=True)
def _row(B, l, i, x):
    for c in range(x.size):
        x[c] = np.float64(B[l, i, c])


@njit(cache=True)
def _cached_columns(B, i, j, eta, cols, have, slot_of, owner, stamp, clock):
    """(si, sj): the slots of ``cols`` (cap, p, n) holding columns i and j, K_l[:, i] = L_l L_l[i],
    of every factor kernel l with eta_l != 0 (``have`` marks the columns a slot holds); missing
    ones are computed (O(n r) each, one read of L_l when both miss) into the least recently used
    slots."""
    si, sj = slot_of[i], slot_of[j]
    if si < 0:
        si = _claim_slot(i, slot_of, owner, stamp, have, sj)
    stamp[si] = clock
    if sj < 0:
        sj = _claim_slot(j, slot_of, owner, stamp, have, si)
    stamp[sj] = clock
    xi = np.empty(B.shape[2])
    xj = np.empty(B.shape[2])
    for l in range(B.shape[0]):
        if eta[l] == 0.0:
            continue
        miss_i, miss_j = not have[si, l], not have[sj, l]
        if miss_i and miss_j:
            _row(B, l, i, xi)
            _row(B, l, j, xj)
            _factor_columns2(B[l], xi, xj, cols[si, l], cols[sj, l])
        elif miss_i:
            _row(B, l, i, xi)
            _factor_column(B[l], xi, cols[si, l])
        elif miss_j:
            _row(B, l, j, xj)
            _factor_column(B[l], xj, cols[sj, l])
        have[si, l] = True
        have[sj, l] = True
    return si, sj


@njit(cache=True)
def _projections(B, y, alpha, P):
    """P_l = L_l^T D(y) alpha (r,) for every factor L_l of B (p, n, r)."""
    for l in range(B.shape[0]):
        for c in range(P.shape[1]):
            P[l, c] = 0.0
        for k in range(B.shape[1]):
            v = y[k] * alpha[k]
            if v != 0.0:
                for c in range(P.shape[1]):
                    P[l, c] += np.float64(B[l, k, c]) * v


@njit(cache=True)
def _freshen(B, Z, P, fresh, eta):
    """z_l = L_l P_l for the factor kernels with eta_l != 0 whose z_l went stale (O(n r) each)."""
    for l in range(Z.shape[0]):
        if eta[l] != 0.0 and not fresh[l]:
            _factor_column(B[l], P[l], Z[l])
            fresh[l] = True


@njit(cache=True)
def _pair_terms(B, Z, P, factor, i, j, delta, curv):
    """Delta_l = z_lj - z_li and H_l = K_l,ii + K_l,jj - 2 K_l,ij of the pair (i, j); on factors,
    with u = L_l[j] - L_l[i]: Delta_l = u^T P_l and H_l = ||u||^2 (O(r), never below 0)."""
    for l in range(B.shape[0]):
        if factor:
            dl = 0.0
            cl = 0.0
            for c in range(B.shape[2]):
                u = np.float64(B[l, j, c]) - np.float64(B[l, i, c])
                dl += u * P[l, c]
                cl += u * u
            delta[l] = dl
            curv[l] = cl
        else:
            delta[l] = Z[l, j] - Z[l, i]
            # entries widened to float64 before any arithmetic (float32 banks give the float64 result)
            curv[l] = np.float64(B[l, i, i]) + np.float64(B[l, j, j]) - 2.0 * np.float64(B[l, i, j])


@njit(cache=True)
def _move_row(Ki, Kj, t, e, Zl, g):
    """z_l += t (K_l[:, j] - K_l[:, i]) and g += eta_l z_l in one sweep (columns = rows: K_l symmetric)."""
    for k in range(Zl.size):
        Zl[k] += t * (np.float64(Kj[k]) - np.float64(Ki[k]))
        g[k] += e * Zl[k]


@njit(cache=True)
def _refresh(B, Z, P, fresh, factor, y, alpha, q, d, a, w, gammas, eta, g):
    """q exactly (v^T z_l, or ||P_l||^2 on factors), then eta and the gradient."""
    if factor:
        for l in range(P.shape[0]):
            acc = 0.0
            for c in range(P.shape[1]):
                acc += P[l, c] * P[l, c]
            q[l] = acc
        kernel_gammas(q, d, gammas)
        my_weights(gammas, my_gamma(gammas, w), a, eta)
        _freshen(B, Z, P, fresh, eta)
        scaled_gradient(Z, y, eta, g)
    else:
        _exact_forms(Z, y, alpha, q)
        _weights_and_gradient(Z, y, q, d, a, w, gammas, eta, g)


@njit(cache=True)
def smo_solve(B, factor, y, alpha, Z, q, d, a, C, eps, max_steps, cache_columns):
    """SMO on min G(alpha), 0 <= alpha <= C, y^T alpha = 0, for the working-set kernels as stored:
    ``factor`` False: B (p, n, n) the K_l; True: B (p, n, r) the factors L_l, K_l = L_l L_l^T.

    Updates alpha, Z (z_l = K_l D(y) alpha, (p, n), exact on entry) and q in place. Returns (steps,
    final violation, code): code SMO_CONVERGED (maximal violation of OPT_6 <= 2 eps), SMO_MAX_STEPS,
    or SMO_STALLED (the line search along the maximal violating pair gives t = 0: rounding level).
    After a step q_l(t) comes from the quadratic-in-t formula, so the new eta is known before z is
    touched and the z update and the new gradient share one sweep; q is recomputed exactly every
    REFRESH_EVERY steps. The representation enters only where kernel entries are read:
      dense: Delta_l from z, H_l from entries, z_l += t (K_l[:, j] - K_l[:, i]) from rows of B for
        every kernel: O(n p) per step;
      factors: P_l = L_l^T D(y) alpha is kept for every kernel (O(r p) per step) and gives Delta_l,
        H_l and q_l; z_l is kept only for the kernels with eta_l != 0 (the only ones in the gradient;
        a kernel whose eta_l turns non-zero gets z_l = L_l P_l), from the columns L_l L_l[i] held in
        a cache of ``cache_columns`` >= 2 indices (least recently used replaced, as libsvm caches
        kernel columns): O(n p_active + r p) per step on hits, O(n r p_active) on misses.
    The z of kernels with eta_l = 0 are stale on return (the caller recomputes z exactly).
    """
    p, n = Z.shape
    gammas = np.empty(p)
    eta = np.empty(p)
    g = np.empty(n)
    delta = np.empty(p)
    curv = np.empty(p)
    w = (d / a) ** 2
    cap = max(cache_columns, 2) if factor else 0
    cols = np.empty((cap, p, n))
    have = np.zeros((cap, p), dtype=np.bool_)
    slot_of = np.full(n if factor else 0, -1, dtype=np.int64)
    owner = np.full(cap, -1, dtype=np.int64)
    stamp = np.zeros(cap, dtype=np.int64)
    P = np.zeros((p, B.shape[2]) if factor else (0, 0))
    fresh = np.ones(p, dtype=np.bool_)
    if factor:
        _projections(B, y, alpha, P)
    _weights_and_gradient(Z, y, q, d, a, w, gammas, eta, g)
    steps = 0
    while True:
        i, j, violation = violating_pair(g, y, alpha, C)
        if i < 0 or j < 0 or violation <= 2.0 * eps:
            return steps, violation, SMO_CONVERGED
        if steps >= max_steps:
            return steps, violation, SMO_MAX_STEPS
        # alpha_i -= y_i t (i in the low set may move that way), alpha_j += y_j t
        t_i = alpha[i] if y[i] > 0.0 else C - alpha[i]
        t_j = C - alpha[j] if y[j] > 0.0 else alpha[j]
        t_max = min(t_i, t_j)
        _pair_terms(B, Z, P, factor, i, j, delta, curv)
        t = line_search(q, delta, curv, d, a, y[i] - y[j], t_max)
        steps += 1
        if t <= 0.0:
            return steps, violation, SMO_STALLED
        alpha[i] -= y[i] * t
        alpha[j] += y[j] * t
        if t == t_i:  # land exactly on the bound that limited the step
            alpha[i] = 0.0 if y[i] > 0.0 else C
        if t == t_j:
            alpha[j] = C if y[j] > 0.0 else 0.0
        alpha[i] = min(max(alpha[i], 0.0), C)
        alpha[j] = min(max(alpha[j], 0.0), C)
        for l in range(p):
            q[l] = q[l] + t * (2.0 * delta[l] + t * curv[l])
        kernel_gammas(q, d, gammas)
        my_weights(gammas, my_gamma(gammas, w), a, eta)
        for k in range(n):
            g[k] = -y[k]
        if factor:
            _freshen(B, Z, P, fresh, eta)     # before the move: P is still that of the old alpha
            si, sj = _cached_columns(B, i, j, eta, cols, have, slot_of, owner, stamp, steps)
            for l in range(p):
                if eta[l] != 0.0:
                    _move_row(cols[si, l], cols[sj, l], t, eta[l], Z[l], g)
                else:
                    fresh[l] = False
                for c in range(P.shape[1]):
                    P[l, c] += t * (np.float64(B[l, j, c]) - np.float64(B[l, i, c]))
        else:
            for l in range(p):
                _move_row(B[l, i], B[l, j], t, eta[l], Z[l], g)
        if steps % REFRESH_EVERY == 0:
            _refresh(B, Z, P, fresh, factor, y, alpha, q, d, a, w, gammas, eta, g)


@njit(cache=True)
def refresh_cache(B, factor, y, alpha, Z, q):
    """Recompute z_l = K_l D(y) alpha and q_l = alpha^T D(y) K_l D(y) alpha exactly; on factors
    z_l = L_l (L_l^T D(y) alpha) (O(n r) per kernel)."""
    p, n = Z.shape
    v = y * alpha
    if factor:
        P = np.empty((p, B.shape[2]))
        _projections(B, y, alpha, P)
    for l in range(p):
        if factor:
            _factor_column(B[l], P[l], Z[l])
        else:
            for i in range(n):
                s = 0.0
                for k in range(n):
                    s += np.float64(B[l, i, k]) * v[k]
                Z[l, i] = s
        acc = 0.0
        for i in range(n):
            acc += v[i] * Z[l, i]
        q[l] = acc
