"""The normalisation rules of a bank (``normalize``: "trace", "diag" or None), applied to K(Xa, Xb),
and the one evaluator of a bank's kernels on new rows (``cross_kernels``).

Shared by the build (training kernels), ``KernelBank.cross`` and ``MKLModel`` (cross kernels of
new data), so that all three scale a kernel the same way.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

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


def cross_kernels(specs: Sequence[KernelSpec], Xa: np.ndarray, Xb: np.ndarray, rule: str | None,
                  factors: Sequence[float]) -> Iterator[tuple[int, np.ndarray]]:
    """(k, K_k(Xa, Xb)) for each spec in order, with the bank's normalisation ``rule`` and kernel k's
    training factor ``factors[k]`` (``normalize_block``): the kernels of new (standardised) rows Xa
    against training rows Xb exactly as the bank scales them. ``spec.compute(Xa, Xb)`` is
    ``spec.from_base(spec.base(Xa, Xb))``; consecutive kernels sharing a pairwise base (the Gaussian
    widths on one feature set, adjacent in bank order) reuse it, as the build does. Each K is
    float64 (len(Xa), len(Xb)), valid until the next one is yielded."""
    key, base = None, None
    for k, spec in enumerate(specs):
        if spec.base_key != key:
            key, base = spec.base_key, spec.base(Xa, Xb)
        yield k, normalize_block(spec.from_base(base), rule, factors[k], spec, Xa, Xb)
