"""What a model fitted on a factor bank keeps for prediction: landmarks, transforms and v_m.

On a factor bank kernel m is K~_m = L_m L_m^T with L_m (n x r_m) and, for any point x,

    L_m(x) = rownorm( k_m(x~, Z_m) T_m )                                  (``bank.factor.factor_rows``)

where Z_m are the landmark (Nystrom) or pivot (Cholesky) rows of the standardised training set, T_m the
kernel's r x r transform (the "trace" normalisation folded in) and rownorm the "diag" rule (each row
scaled to unit norm; identity otherwise). A head h of the fitted model predicts

    f_h(x) = sum_{m in kept} w_{h,m} K~_m(x, X) c_h + b_h = sum_{m in kept} L_m(x) v_{h,m} + b_h,
    v_{h,m} = w_{h,m} L_m^T c_h                                            (r_m numbers per kernel)

so the model needs neither the training rows nor the dual coefficients: only the landmark rows of the
kept kernels (p <= k r distinct rows), each kernel's transform and the v_{h,m}. At n = 50,000 with 20
kept kernels of rank 64 that is ~1,300 rows and 20 x 64 x 64 transform entries instead of 50,000 rows.
Prediction evaluates L_m(x) for kept kernels only, in row blocks of bounded memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mklscale.bank.factor import factor_rows
from mklscale.bank.spec import KernelSpec

#: bytes of the per-block features L_m(x) (n_block x r float64, one kernel at a time) and kernel block
BATCH_BYTES = 32 * 2**20


@dataclass
class FactorTerms:
    """The factor part of an MKLModel (module docstring).

    landmark_rows : (p, d) standardised training rows used as landmarks by some kept kernel.
    landmark_index : (k, r) positions in ``landmark_rows`` of each kept kernel's landmarks (-1: padding).
    transforms : (k, r, r) T_m (zero-padded beyond the kernel's rank).
    coef : (H, k, r) v_{h,m} = w_{h,m} L_m^T c_h.
    row_normalise : the bank's "diag" rule (each row of L_m(x) scaled to unit norm).
    """

    landmark_rows: np.ndarray
    landmark_index: np.ndarray
    transforms: np.ndarray
    coef: np.ndarray
    row_normalise: bool

    @classmethod
    def from_bank(cls, bank, kept: np.ndarray, weights: np.ndarray, dual: np.ndarray) -> FactorTerms:
        """v_{h,m} = w_{h,m} L_m^T c_h for the kept kernels; ``weights`` (H, k), ``dual`` (H, n)."""
        r = int(bank.rank)
        marks = np.full((kept.size, r), -1, dtype=np.int64)
        transforms = np.zeros((kept.size, r, r))
        coef = np.zeros((weights.shape[0], kept.size, r))
        for j, m in enumerate(kept.tolist()):
            z = np.asarray(bank.landmarks(m), dtype=np.int64)
            marks[j, :z.size] = z
            T = np.asarray(bank.transform(m), dtype=np.float64)
            transforms[j, :T.shape[0], :T.shape[1]] = T
            L = np.asarray(bank.factor(m), dtype=np.float64)
            coef[:, j, :L.shape[1]] = weights[:, j:j + 1] * (dual @ L)
        used = np.unique(marks[marks >= 0])
        index = np.where(marks >= 0, np.searchsorted(used, np.maximum(marks, 0)), -1)
        return cls(landmark_rows=np.ascontiguousarray(bank.X_train[used], dtype=np.float64), landmark_index=index,
                   transforms=transforms, coef=coef, row_normalise=bank.normalize == "diag")

    @property
    def n_landmarks(self) -> int:
        return int(self.landmark_rows.shape[0])

    def __repr__(self) -> str:
        H, k, r = self.coef.shape
        return (f"<FactorTerms {k} kernel(s) of rank <= {r}, {self.n_landmarks} landmark rows, {H} head(s)"
                f"{', rows normalised' if self.row_normalise else ''}>")

    def decision(self, Xs: np.ndarray, specs: list[KernelSpec]) -> np.ndarray:
        """(n_new, H): sum_m L_m(x) v_{h,m} for standardised rows ``Xs``, in row blocks."""
        H, k, r = self.coef.shape
        out = np.zeros((Xs.shape[0], H))
        step = max(1, BATCH_BYTES // (8 * max(1, r, self.n_landmarks)))
        for start in range(0, Xs.shape[0], step):
            block = Xs[start:start + step]
            for j, spec in enumerate(specs):
                out[start:start + step] += self.features(block, spec, j) @ self.coef[:, j, :].T
        return out

    def features(self, Xs: np.ndarray, spec: KernelSpec, j: int) -> np.ndarray:
        """L_m(x) (n_new, r) of kept kernel j (zero columns beyond its rank: T_m is zero-padded)."""
        marks = self.landmark_index[j]
        used = int(np.count_nonzero(marks >= 0))  # landmarks first, -1 padding after
        return factor_rows(spec, Xs, self.landmark_rows[marks[:used]], self.transforms[j, :used, :],
                           self.row_normalise)

    # ---- files --------------------------------------------------------------------------------
    def arrays(self) -> dict[str, np.ndarray]:
        return {"factor_landmark_rows": self.landmark_rows, "factor_landmark_index": self.landmark_index,
                "factor_transforms": self.transforms, "factor_coef": self.coef}

    @classmethod
    def from_arrays(cls, a: dict, row_normalise: bool) -> FactorTerms:
        """Read back what ``arrays`` wrote (``model_checks`` checks the shapes against the model's)."""
        return cls(landmark_rows=a["factor_landmark_rows"], landmark_index=a["factor_landmark_index"],
                   transforms=a["factor_transforms"], coef=a["factor_coef"], row_normalise=bool(row_normalise))
