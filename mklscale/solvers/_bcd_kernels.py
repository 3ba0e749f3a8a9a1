"""Numba kernels of the primal block coordinate descent on factor banks (``bcd.py``).

Every kernel reads a stored factor L (n, r) as the bank holds it (float32 or float64) and
accumulates in float64; vectors over the n points are float64.

Losses (``LOSS_CODES``): 0 logistic, loss(y, f) = log(1 + exp(-y f)), loss' = -y s, loss'' = s (1 - s)
with s = sigmoid(-y f); 1 square, loss = (y - f)^2 / 2, loss' = f - y, loss'' = 1; 2 the hinge smoothed by
its Moreau envelope of width mu > 0 (``smoothing``; Chapelle, Neural Comput. 19, 2007, "Huber" loss), with
z = y f: h_mu = 0 for z >= 1, (1 - z)^2 / (2 mu) for 1 - mu < z < 1, 1 - z - mu / 2 for z <= 1 - mu; loss' =
-y a with a = min(1, max(0, (1 - z) / mu)), loss'' = 1 / mu on 1 - mu < z < 1 and 0 elsewhere (a generalised
second derivative). 0 <= hinge - h_mu <= mu / 2.
"""

from __future__ import annotations

import numpy as np
from numba import njit

LOSS_CODES = {"logistic": 0, "square": 1, "hinge": 2}


@njit(cache=True)
def transposed_product(L, g, out):
    """out = L^T g (r,), accumulated in float64 row by row (L is row-major: one pass over it)."""
    n, r = L.shape
    for j in range(r):
        out[j] = 0.0
    for i in range(n):
        gi = g[i]
        for j in range(r):
            out[j] += L[i, j] * gi


@njit(cache=True)
def product(L, d, shift, out):
    """out = L d - shift (n,): the change of the decision values when a block moves by d (the
    centring of the block's columns gives the constant ``shift`` = mu^T d)."""
    n, r = L.shape
    for i in range(n):
        acc = 0.0
        for j in range(r):
            acc += L[i, j] * d[j]
        out[i] = acc - shift


@njit(cache=True)
def scaled_centred(L, mu, weight, out):
    """out = diag(weight) (L - 1 mu^T) in out's precision (the rows whose Gram is the block Hessian)."""
    n, r = L.shape
    for i in range(n):
        w = weight[i]
        for j in range(r):
            out[i, j] = (L[i, j] - mu[j]) * w


@njit(cache=True)
def _logistic_at(y, f):
    t = -y * f
    # log(1 + exp(t)) without overflow
    if t > 0.0:
        return t + np.log1p(np.exp(-t))
    return np.log1p(np.exp(t))


@njit(cache=True)
def _smoothed_hinge_at(z, smoothing):
    if z >= 1.0:
        return 0.0
    if z > 1.0 - smoothing:
        return (1.0 - z) * (1.0 - z) / (2.0 * smoothing)
    return 1.0 - z - 0.5 * smoothing


@njit(cache=True)
def loss_along(code, y, f, u, step, smoothing):
    """sum_i loss(y_i, f_i + step u_i) (``smoothing``: the hinge's mu, unused by the other losses)."""
    total = 0.0
    if code == 0:
        for i in range(f.size):
            total += _logistic_at(y[i], f[i] + step * u[i])
    elif code == 2:
        for i in range(f.size):
            total += _smoothed_hinge_at(y[i] * (f[i] + step * u[i]), smoothing)
    else:
        for i in range(f.size):
            e = y[i] - f[i] - step * u[i]
            total += 0.5 * e * e
    return total


@njit(cache=True)
def derivatives(code, y, f, grad, curv, smoothing):
    """grad = loss'(y, f), curv = loss''(y, f) in place; returns sum_i loss(y_i, f_i) (``smoothing``: the
    hinge's mu, unused by the other losses)."""
    total = 0.0
    if code == 0:
        for i in range(f.size):
            t = -y[i] * f[i]
            if t > 0.0:
                e = np.exp(-t)
                s = 1.0 / (1.0 + e)
                total += t + np.log1p(e)
            else:
                e = np.exp(t)
                s = e / (1.0 + e)
                total += np.log1p(e)
            grad[i] = -y[i] * s
            curv[i] = s * (1.0 - s)
    elif code == 2:
        for i in range(f.size):
            z = y[i] * f[i]
            total += _smoothed_hinge_at(z, smoothing)
            if z >= 1.0:
                grad[i], curv[i] = 0.0, 0.0
            elif z > 1.0 - smoothing:
                grad[i], curv[i] = -y[i] * (1.0 - z) / smoothing, 1.0 / smoothing
            else:
                grad[i], curv[i] = -y[i], 0.0
    else:
        for i in range(f.size):
            e = f[i] - y[i]
            grad[i] = e
            curv[i] = 1.0
            total += 0.5 * e * e
    return total


@njit(cache=True)
def group_minimiser(eigenvalues, a_rotated, threshold):
    """The minimiser w~ (in the eigenbasis) of (1/2) w^T H w - a^T w + threshold ||w|| for
    H = Q diag(eigenvalues) Q^T > 0 and a~ = Q^T a with ||a~|| > threshold.

    Optimality: (H + (threshold / ||w||) I) w = a, so w~ = a~ / (eigenvalues + mu) where mu > 0 solves
    phi(mu) = mu ||a~ / (eigenvalues + mu)|| = threshold; phi increases from 0 to ||a~||, so the root
    is unique and bisection on [0, mu_hi] finds it (to the float64 resolution of mu)."""
    r = eigenvalues.size
    lo, hi = 0.0, 1.0
    for _ in range(200):
        acc = 0.0
        for j in range(r):
            q = hi * a_rotated[j] / (eigenvalues[j] + hi)
            acc += q * q
        if np.sqrt(acc) >= threshold:
            break
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        acc = 0.0
        for j in range(r):
            q = mid * a_rotated[j] / (eigenvalues[j] + mid)
            acc += q * q
        if np.sqrt(acc) < threshold:
            lo = mid
        else:
            hi = mid
    mu = 0.5 * (lo + hi)
    out = np.empty(r)
    for j in range(r):
        out[j] = a_rotated[j] / (eigenvalues[j] + mu)
    return out
