"""Small in-memory kernel banks shared by solver tests."""

from __future__ import annotations

import numpy as np


def subset_gaussian_bank(n: int, M: int, seed: int):
    """Unit-diagonal Gaussian kernels on random feature subsets with varying widths, and labels."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 5))
    y = np.where(X[:, 0] * X[:, 1] + 0.5 * X[:, 2] + 0.3 * rng.normal(size=n) > 0, 1.0, -1.0)
    grams = []
    for _ in range(M):
        feats = rng.choice(5, size=int(rng.integers(1, 4)), replace=False)
        sq = ((X[:, None, feats] - X[None, :, feats]) ** 2).sum(-1)
        grams.append(np.exp(-sq / (2.0 * (0.5 + 3.0 * rng.random()) ** 2)))
    return np.array(grams), y
