"""Per-kernel statistics of a stored kernel, and its crc32c checksum (what ``verify`` compares).

A bank records them for every kernel (``trace``, ``fro``, ``lambda_max``, ``checksum``; see
``group``): the build and ``KernelBank.from_arrays`` compute them with ``kernel_stats``,
``KernelBank.verify`` recomputes the checksum of what it reads.
"""

from __future__ import annotations

import google_crc32c
import numpy as np


def kernel_stats(K: np.ndarray) -> tuple[float, float, float, int]:
    """(trace, Frobenius norm, largest eigenvalue, crc32c) of one stored kernel, in float64.

    trace = sum_i K_ii and ||K||_F = sqrt(sum_ij K_ij^2) of the stored values; the largest
    eigenvalue is an upper bound within a factor 1 + LAMBDA_TOL (1e-8) of the true one (Lanczos
    from a start vector fixed by K, capped by Gershgorin's bound: deterministic; see
    ``_compute.lambda_max``). Solvers use it for step sizes and the safe screening bound
    ||v||_K <= ||u||_K + sqrt(lambda_max) ||v - u||, which an overestimate keeps safe (the
    ARPACK value used before could fall short by up to 1e-8 relative). Every step releases the GIL.
    """
    from mklscale.bank import _compute

    native = K.dtype.newbyteorder("=") if K.dtype.kind == "f" and K.dtype.itemsize in (4, 8) else np.dtype(np.float64)
    A = np.ascontiguousarray(K, dtype=native)  # no copy for the stored float32/float64 kernels
    tr, fro, colabs = _compute.trace_fro_colabs(A)
    lam = _compute.lambda_max(A, _compute.LAMBDA_TOL, colabs)
    return float(tr), float(fro), float(lam), checksum(K)


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
