"""The normalisation rules of a bank (``normalize``: "trace", "diag" or None), applied to K(Xa, Xb).

Shared by the build (training kernels), ``KernelBank.cross`` and ``MKLModel`` (cross kernels of
new data), so that all three scale a kernel the same way.
"""

from __future__ import annotations

import numpy as np

from mklscale.bank.spec import KernelSpec


def normalize_block(K: np.ndarray, rule: str | None, factor: float, spec: KernelSpec, Xa: np.ndarray, Xb: np.ndarray) -> np.ndarray:
    """Apply a normalisation rule to K(Xa, Xb).

    trace: K * factor with factor = 1 / trace(K_train) (unit trace on the training set);
    diag:  K_ij / sqrt(k(a_i, a_i) k(b_j, b_j)) (unit diagonal; zero diagonals left unscaled);
    None:  unchanged.
    """
    if rule == "trace":
        return K * factor
    if rule == "diag":
        da, db = _safe_diag(spec.diag(Xa)), _safe_diag(spec.diag(Xb))
        return K / np.sqrt(np.outer(da, db))
    return K


def _safe_diag(d: np.ndarray) -> np.ndarray:
    return np.where(d > 1e-300, d, 1.0)
