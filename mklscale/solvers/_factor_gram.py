"""The Gram matrix of a working set's centred factor blocks, G = L~_W^T L~_W (``bcd.py``: the square
loss's Newton steps multiply by it, R_W^2 entries read per product, instead of passing twice over the
n R_A entries of the factors).

Layout: W's blocks in held order, r columns each. Each r x r tile G_ij = L~_i^T L~_j is one matrix
product of the two blocks' centred factors (L - 1 mu^T, in the bank's precision), so it depends only on
blocks i and j, not on the steps in which W grew or which blocks left it: growing W computes the tiles of
the blocks that joined, dropping blocks keeps the others' tiles as they are, and a run resumed from a
checkpoint rebuilds the same bits. Cost: n R_W^2 flops to build (n = 50,000, r = 64: about 95 GFlop/s
on 2 cores), 2 n r R_W a block that joins.
"""

from __future__ import annotations

import numpy as np


class CentredGram:
    """G for the first ``blocks`` blocks of W (``update`` extends it to all of them)."""

    def __init__(self, r: int):
        self.r = int(r)
        self.G: np.ndarray | None = None
        self.blocks = 0

    def clear(self) -> None:
        self.G, self.blocks = None, 0

    def update(self, blocks: list, mu: np.ndarray) -> None:
        """G for all of ``blocks`` (each L_m (n, r)), their column means ``mu`` (K, r) (zero without a bias).
        The centred factors of the blocks that joined are held meanwhile (their bytes once more)."""
        K, K0, r = len(blocks), self.blocks, self.r
        if K == K0:
            return
        G = np.empty((K * r, K * r), dtype=blocks[0].dtype)
        if self.G is not None:
            G[:K0 * r, :K0 * r] = self.G
        joined = [self._centred(blocks[j], mu[j]) for j in range(K0, K)]
        for i in range(K):
            left = joined[i - K0] if i >= K0 else self._centred(blocks[i], mu[i])
            for j in range(max(i, K0), K):
                tile = left.T @ joined[j - K0]
                G[i * r:(i + 1) * r, j * r:(j + 1) * r] = tile
                G[j * r:(j + 1) * r, i * r:(i + 1) * r] = tile.T
        self.G, self.blocks = G, K

    def bytes_to_update(self, blocks: int, itemsize: int) -> int:
        """The bytes an update to ``blocks`` blocks holds at its peak: the new Gram beside the old one."""
        return ((blocks * self.r) ** 2 + (0 if self.G is None else self.G.size)) * int(itemsize)

    def keep(self, mask: np.ndarray) -> None:
        """Keep the blocks where ``mask`` (over W before the drop) is True, as W does."""
        if self.G is None:
            return
        kept = np.flatnonzero(np.asarray(mask[:self.blocks], dtype=bool))
        columns = (kept[:, None] * self.r + np.arange(self.r)).ravel()
        self.G, self.blocks = self.G[np.ix_(columns, columns)], int(kept.size)

    def times(self, S: np.ndarray, A: np.ndarray) -> np.ndarray:
        """G_AA S for S (|A|, r) on the blocks at positions A of W (float64; the product in G's precision).
        It multiplies by all of G, S padded with zeros: A is most of W, and a copy of G_AA costs more."""
        padded = np.zeros((self.blocks, self.r), dtype=self.G.dtype)
        padded[A] = S
        return (self.G @ padded.ravel()).reshape(self.blocks, self.r)[A].astype(np.float64)

    @staticmethod
    def _centred(L: np.ndarray, mu: np.ndarray) -> np.ndarray:
        return L - mu.astype(L.dtype)
