"""Per-task functions of passes over a factor bank (K_m = L_m L_m^T, L_m (n, r) stored).

The same rules as ``tasks`` (a task gets the bank's path, reopens it once per process, returns one
result per kernel in the order of ``kernels``); each kernel's factor is read whole into a buffer
reused for the task (n * r entries: 12.8 MB at n = 50,000, r = 64 in float32) and folded with the
fixed-order numba kernels of ``factor_kernels``. The ``local_*`` functions compute the same
numbers from a factor already in the driver (the block cache), with the same kernels and bits.
"""

from __future__ import annotations

import numpy as np

from mklscale.engine import factor_kernels as F
from mklscale.engine.reader import KernelReader
from mklscale.engine.tasks import open_bank


def _factors(path: str, kernels):
    """Yield (position, L_m) for the task's kernels; L_m lives in a buffer reused across kernels."""
    bank = open_bank(path)
    n, r = bank.block_shape
    buf = np.empty((n, r), dtype=bank.dtype)
    with KernelReader(bank) as reader:
        for pos, m in enumerate(np.asarray(kernels).tolist()):
            reader.read_rows(int(m), 0, n, buf)
            yield pos, buf


# ---- one factor (the driver's cached blocks and the tasks share these) ------------------------------
def local_quad(L, U) -> np.ndarray:
    """(k,) u_j^T L L^T u_j for U (k, n)."""
    P = np.zeros((U.shape[0], L.shape[1]))
    F.project(L, 0, U, P)
    out = np.empty(U.shape[0])
    F.sum_squares(P, out)
    return out


def local_matvec(L, U) -> np.ndarray:
    """(k, n) L (L^T u_j) for U (k, n)."""
    P = np.zeros((U.shape[0], L.shape[1]))
    F.project(L, 0, U, P)
    out = np.empty(U.shape)
    F.expand(L, 0, P, out)
    return out


# ---- tasks ----------------------------------------------------------------------------------------
def quad_task(path: str, kernels: np.ndarray, U: np.ndarray) -> np.ndarray:
    """(len(kernels), k): ||L_m^T u_j||^2 for the k vectors U (k, n)."""
    out = np.empty((len(kernels), U.shape[0]))
    for pos, L in _factors(path, kernels):
        out[pos] = local_quad(L, U)
    return out


def quad_each_task(path: str, kernels: np.ndarray, U: np.ndarray) -> np.ndarray:
    """(len(kernels),): ||L_m^T u_m||^2 with one vector per kernel, U (len(kernels), n)."""
    out = np.empty(len(kernels))
    for pos, L in _factors(path, kernels):
        out[pos] = local_quad(L, U[pos:pos + 1])[0]
    return out


def matvec_task(path: str, kernels: np.ndarray, U: np.ndarray) -> np.ndarray:
    """(len(kernels), k, n): L_m (L_m^T u_j) for the k vectors U (k, n)."""
    out = np.empty((len(kernels),) + U.shape)
    for pos, L in _factors(path, kernels):
        out[pos] = local_matvec(L, U)
    return out


def matvec_each_task(path: str, kernels: np.ndarray, U: np.ndarray) -> np.ndarray:
    """(len(kernels), n): L_m (L_m^T u_m) with one vector per kernel."""
    out = np.empty((len(kernels), U.shape[1]))
    for pos, L in _factors(path, kernels):
        out[pos] = local_matvec(L, U[pos:pos + 1])[0]
    return out


def frob_task(path: str, kernels: np.ndarray, T: np.ndarray) -> np.ndarray:
    """(len(kernels),): <L_m L_m^T, T>_F."""
    out = np.empty(len(kernels))
    for pos, L in _factors(path, kernels):
        out[pos] = F.frobenius_with(L, T)
    return out


def combine_task(path: str, kernels: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """(n, n): sum_m weights[m] L_m L_m^T over the task's kernels, one product (``add_weighted_outer``)."""
    bank = open_bank(path)
    out = np.zeros((bank.n, bank.n))
    F.add_weighted_outer([L.copy() for _, L in _factors(path, kernels)], weights, out)
    return out


def gram_task(path: str, rows_kernels: np.ndarray, cols_kernels: np.ndarray, upper: bool, budget: int) -> np.ndarray:
    """(len(rows), len(cols)): ||L_a^T L_b||_F^2, accumulating every L_a^T L_b over the same row
    panels of all the kernels (at most ``budget`` bytes of panels). With ``upper`` only b >= a."""
    bank = open_bank(path)
    n, r = bank.block_shape
    kernels = np.asarray(rows_kernels) if upper else np.concatenate([rows_kernels, cols_kernels])
    rows = int(max(1, min(n, budget // max(1, len(kernels) * r * bank.dtype.itemsize))))
    ca, cb = len(rows_kernels), len(cols_kernels)
    C = np.zeros((ca, cb, r, r))
    with KernelReader(bank) as reader:
        for r0 in range(0, n, rows):
            r1 = min(n, r0 + rows)
            panel = np.empty((len(kernels), r1 - r0, r), bank.dtype)
            for c, m in enumerate(kernels):
                reader.read_rows(int(m), r0, r1, panel[c])
            A = panel[:ca]
            F.cross_products(A, A if upper else panel[ca:], C, upper)
    G = np.zeros((ca, cb))
    F.frobenius_squares(C, G, upper)
    return G
