"""Whether numba is about to compile: the first run of a fresh install compiles the kernels
(tens of seconds, before any progress), later runs load them from numba's on-disk cache
(``cache=True``, in ``__pycache__`` or ``$NUMBA_CACHE_DIR``).

The check reads only each function's cache index (a few hundred bytes; nothing is compiled or
loaded): an index that is missing, from another numba version or older than the source file means
the next call compiles. An index of another argument-type signature is taken as compiled, so the
check may miss a compilation but never announces one that does not happen.
"""

from __future__ import annotations

from collections.abc import Iterable

#: what a progress bar says while its first task waits for numba
COMPILING = "compiling kernels (first run only)"


def compiled_before(function) -> bool:
    """Whether numba's disk cache holds a compiled version of the jitted ``function`` for its
    current source. True for anything without a disk cache (a plain function, NUMBA_DISABLE_JIT,
    a cache numba could not create): there is nothing to announce for those."""
    if getattr(function, "overloads", None):  # compiled in this process already
        return True
    cache_file = getattr(getattr(function, "_cache", None), "_cache_file", None)
    if cache_file is None:
        return True
    try:
        return bool(cache_file._load_index())
    except Exception:  # an unreadable index is numba's to report when it compiles
        return True


def will_compile(functions: Iterable) -> bool:
    """Whether calling the jitted ``functions`` (the entry points a step calls) compiles any of them."""
    return not all(compiled_before(f) for f in functions)
