"""How a selection of kernels is cut into tasks, and the fixed tree that adds partial sums.

Per-kernel results never depend on the plan (each kernel is computed whole inside one task).
The one quantity summed across kernels, ``combine``, is cut by ``blocks_of`` into blocks fixed by
the selection alone and added over ``tree_pairs``, so it does not depend on the plan either.
"""

from __future__ import annotations

import numpy as np

#: Bytes of kernel data per task: large enough that per-task overhead (~0.1 ms threaded, ~1 ms
#: distributed) is small against the read, small enough to balance work over a few cores.
TASK_BYTES = 64 * 2**20


def split_by_shard(kernels: np.ndarray, kernels_per_shard: int, kernel_bytes: int,
                   task_bytes: int = TASK_BYTES) -> list[np.ndarray]:
    """Cut non-decreasing kernel indices into tasks; returns each task's positions in ``kernels``.

    A task holds consecutive entries of one shard, at most max(1, task_bytes // kernel_bytes) of them.
    """
    kernels = np.asarray(kernels, dtype=np.int64)
    if kernels.size == 0:
        return []
    per_task = max(1, int(task_bytes // max(1, kernel_bytes)))
    positions = np.arange(kernels.size)
    cuts = np.flatnonzero(np.diff(kernels // kernels_per_shard)) + 1
    return [part[i:i + per_task] for part in np.split(positions, cuts) for i in range(0, part.size, per_task)]


def blocks_of(kernels: np.ndarray, size: int) -> list[np.ndarray]:
    """Consecutive blocks of at most ``size`` kernels (gram_of_kernels' row/column blocks)."""
    kernels = np.asarray(kernels, dtype=np.int64)
    return [kernels[i:i + size] for i in range(0, kernels.size, max(1, size))]


def tree_pairs(count: int) -> list[list[tuple[int, int]]]:
    """Levels of a fixed pairwise reduction tree over ``count`` leaves: at each level, node i of
    the next level is (2i, 2i + 1) of this one, or the lone last node carried up as (2i, -1)."""
    levels = []
    while count > 1:
        levels.append([(2 * i, 2 * i + 1 if 2 * i + 1 < count else -1) for i in range(-(-count // 2))])
        count = -(-count // 2)
    return levels
