"""Per-kernel statistics of a stored kernel, and its crc32c checksum (what ``verify`` compares).

A bank records them for every kernel (``trace``, ``fro``, ``lambda_max``, ``checksum``; see
``group``): the build and ``KernelBank.from_arrays`` compute them with ``kernel_stats``,
``KernelBank.verify`` recomputes the checksum of what it reads.
"""

from __future__ import annotations

import google_crc32c
import numpy as np


def kernel_stats(K: np.ndarray, exact_lambda: bool = True) -> tuple[float, float, float, int]:
    """(trace, Frobenius norm, largest eigenvalue, crc32c) of one stored kernel, in float64.

    trace = sum_i K_ii and ||K||_F = sqrt(sum_ij K_ij^2) of the stored values; the largest
    eigenvalue is an upper bound within a factor 1 + LAMBDA_TOL (1e-8) of the true one (Lanczos
    from a start vector fixed by K, capped by Gershgorin's bound: deterministic; see
    ``_compute.lambda_max``). Solvers use it for step sizes and the safe screening bound
    ||v||_K <= ||u||_K + sqrt(lambda_max) ||v - u||, which an overestimate keeps safe (the
    ARPACK value used before could fall short by up to 1e-8 relative). Every step releases the GIL.

    ``exact_lambda=False`` (a computed bank's creation, issue 31): no eigensolve; the largest
    eigenvalue is ``lambda_bound`` of the same pass's trace, norm and column sums, a valid upper
    bound that is looser (within 1.16x on per_feature kernels), unless the trace is negative (a
    kernel that may be negative definite, which the solvers' checks name): then Lanczos as above.
    """
    from mklscale.bank import _compute

    native = K.dtype.newbyteorder("=") if K.dtype.kind == "f" and K.dtype.itemsize in (4, 8) else np.dtype(np.float64)
    A = np.ascontiguousarray(K, dtype=native)  # no copy for the stored float32/float64 kernels
    tr, fro, colabs = _compute.trace_fro_colabs(A)
    if exact_lambda or tr < 0:
        lam = _compute.lambda_max(A, _compute.LAMBDA_TOL, colabs)
    else:
        lam = lambda_bound(tr, fro, colabs)
    return float(tr), float(fro), float(lam), checksum(K)


def lambda_bound(tr: float, fro: float, colabs: np.ndarray) -> float:
    """A valid upper bound on the largest eigenvalue of a symmetric n x n matrix K from its trace,
    Frobenius norm and column sums of absolute values c_j = sum_i |K_ij| (``trace_fro_colabs``), with
    no eigensolve: min(G, W) for

        G = max_j c_j                                        (Gershgorin, on columns)
        W = t + sqrt((n - 1) s^2),  t = tr K / n,  s^2 = ||K||_F^2 / n - t^2

    W is Wolkowicz and Styan's bound (Linear Algebra Appl. 29, 1980): t and s^2 are the mean and
    variance of the n real eigenvalues (sum lambda_i = tr K, sum lambda_i^2 = ||K||_F^2), and the
    largest of n numbers is at most their mean plus sqrt(n - 1) times their standard deviation. W is
    never above ||K||_F and is exact when K has one distinct eigenvalue besides a multiple one of
    n - 1 (c I, and every rank-one K = x x^T, e.g. a linear kernel on one feature).

    Rounding: tr, ||K||_F and c come from float64 sums of n^2 terms, each off by at most
    n u relative to the sums of absolute values (u = 2^-53), which are bounded with S = sum_j c_j;
    both bounds are raised by a margin 16 n u of that size, so the value is >= the true largest
    eigenvalue of K (stored values, read exactly in float64). Tested against numpy's eigvalsh.
    """
    colabs = np.asarray(colabs, dtype=np.float64)
    n = colabs.size
    if n == 0:
        return 0.0
    eps = 16.0 * n * np.finfo(np.float64).eps  # several times the sums' worst rounding, relative
    mean, S = tr / n, float(colabs.sum()) / n  # |mean| <= S (S: mean absolute column sum)
    var = fro * fro / n - mean * mean
    W = mean + eps * S + np.sqrt((n - 1) * (max(var, 0.0) + eps * (fro * fro / n + S * S)))
    G = float(colabs.max())
    return float(min(G * (1.0 + eps), W + eps * abs(W)))


def checksum(block: np.ndarray) -> int:
    """crc32c of one kernel's stored bytes (C order, little endian), read in place."""
    little = np.ascontiguousarray(block, dtype=block.dtype.newbyteorder("<"))  # no copy when already so
    return _crc32c_of(little)


#: the per-kernel metadata that changes results, in the order ``meta_checksum`` reads it, with the
#: byte layout it hashes; a factor bank adds ``FACTOR_META_FIELDS``
META_FIELDS = (("norm_factor", "<f8"), ("trace", "<f8"), ("fro", "<f8"), ("lambda_max", "<f8"), ("checksum", "<u4"))
FACTOR_META_FIELDS = (("rank", "<i4"), ("landmarks", "<i8"), ("transform", "<f8"), ("approx_error", "<f8"),
                      ("exact_trace", "<f8"))


def meta_checksum(values: dict, spec_json: str) -> int:
    """crc32c of one kernel's metadata that changes results: its normalisation factor, statistics and
    data checksum, a factor bank's rank, landmarks, transform and errors (``values``: name -> that
    kernel's value, the names of ``META_FIELDS`` and, present in ``values``, ``FACTOR_META_FIELDS``)
    and its spec as stored; ``verify`` compares it (a norm_factor edited by 1.5x moves every
    prediction yet leaves the kernel's bytes intact)."""
    fields = META_FIELDS + tuple(f for f in FACTOR_META_FIELDS if f[0] in values)
    record = b"".join(np.ascontiguousarray(values[name], dtype=dt).tobytes() for name, dt in fields)
    return int(google_crc32c.value(record + spec_json.encode()))


def meta_checksums(group, kernels=None) -> np.ndarray:
    """``meta_checksum`` of the kernels ``kernels`` (default: all) of a bank's zarr group, from its
    stored arrays."""
    names = [name for name, _ in META_FIELDS + FACTOR_META_FIELDS if name in group]
    arrays = {name: group[name][:] for name in names}
    specs = group["spec"][:]
    kernels = range(len(specs)) if kernels is None else kernels
    return np.array([meta_checksum({name: a[m] for name, a in arrays.items()}, str(specs[m])) for m in kernels],
                    dtype=np.uint32)


def checksum_extend(crc: int, block: np.ndarray) -> int:
    """The crc32c of earlier bytes (``crc``) extended over ``block``'s stored bytes: a kernel read
    in row pieces gets the ``checksum`` of the whole kernel piece by piece."""
    return _crc32c_extend(crc, np.ascontiguousarray(block, dtype=block.dtype.newbyteorder("<")))


def _crc32c_in_place():
    """(crc32c of a buffer, crc32c extended over a buffer), without copying it to bytes and releasing
    the GIL: google_crc32c's C library called through ctypes (its Python API takes only bytes, a copy
    of every kernel). Falls back to that API where the C library is not there (the pure-Python build)."""
    import ctypes

    try:
        from google_crc32c import _crc32c

        lib = ctypes.CDLL(_crc32c.__file__)  # exports the libcrc32c it links
        value, extend = lib.crc32c_value, lib.crc32c_extend
    except (ImportError, OSError, AttributeError):
        return (lambda a: int(google_crc32c.value(a.tobytes())),
                lambda crc, a: int(google_crc32c.extend(crc, a.tobytes())))
    value.restype = extend.restype = ctypes.c_uint32
    value.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    extend.argtypes = (ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t)
    return lambda a: int(value(a.ctypes.data, a.nbytes)), lambda crc, a: int(extend(crc, a.ctypes.data, a.nbytes))


_crc32c_of, _crc32c_extend = _crc32c_in_place()
