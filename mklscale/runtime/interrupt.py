"""A clean stop on SIGINT (Ctrl-C) and SIGTERM (preemption, a batch system's time limit).

:func:`stop_cleanly` (the CLI runs every command in it, ``run_pipeline`` its whole run) makes the
first SIGINT/SIGTERM raise :class:`~mklscale.errors.Stopped` in the main thread, wherever the
program is: a bank build flushes the flags of its finished kernels on the way out, a cluster is
closed by its ``with`` block, and the caller turns the exception into one line saying what was
saved (the CLI exits with :data:`EXIT_STOPPED`, 75). Checkpointed solvers run inside
``checkpoint.stop_on_signals``, which takes the signals over for the solve: the solver saves its
state at its next step and raises ``Preempted`` instead. From the first signal on, later signals
are ignored while the stack unwinds and Dask's loggers are silenced, so closing a cluster in the
middle of its work prints no "lost scattered data" or nanny warnings.

:func:`held` is for starting Dask worker processes: SIGINT is ignored meanwhile, and the workers
inherit that (an ignored signal stays ignored across exec, and Python then installs no
KeyboardInterrupt handler), so a Ctrl-C, which the terminal sends to the whole process group,
reaches only this process, which shuts the workers down. A SIGTERM that comes meanwhile is held and
acted on when the block ends; a Ctrl-C in those seconds is lost (press it again).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator

from mklscale.errors import Stopped
from mklscale.runtime.checkpoint import EXIT_PREEMPTED

#: the CLI's exit status after a stop: the one a preempted solver exits with (75, ``EX_TEMPFAIL``: try
#: again later; batch scripts requeue on it)
EXIT_STOPPED = EXIT_PREEMPTED
SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: loggers that report a cluster closed under running work as errors and warnings
_NOISY_LOGGERS = ("distributed", "tornado", "asyncio")

_depth = 0
_stopping: int | None = None


@contextlib.contextmanager
def stop_cleanly() -> Iterator[None]:
    """Within the block the first SIGINT/SIGTERM raises ``Stopped`` in the main thread; see the module
    docstring. Nested blocks share one stop; the outermost restores the previous handlers. Outside
    the main thread (where handlers cannot be installed) this does nothing."""
    global _depth, _stopping
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _raise_once) for s in SIGNALS}
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        for s, handler in previous.items():
            signal.signal(s, handler)
        if _depth == 0:
            _stopping = None


def _raise_once(signum: int, frame) -> None:
    global _stopping
    if _stopping is not None:
        return  # already stopping: let the cleanup finish
    _stopping = signum
    quiet_dask()
    raise Stopped(signum)


def stopping() -> int | None:
    """The signal that is stopping the program (inside :func:`stop_cleanly`), or None."""
    return _stopping


def quiet_dask() -> None:
    """Silence Dask's (and its event loop's) loggers for the rest of the process: once a stop began,
    the warnings of a cluster closed under running work are expected and say nothing new."""
    manager = logging.Logger.manager
    for name in list(manager.loggerDict):
        if name.split(".")[0] in _NOISY_LOGGERS:
            logger = logging.getLogger(name)
            logger.disabled = True
    for name in _NOISY_LOGGERS:
        logging.getLogger(name).disabled = True


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Start worker processes in this block (see the module docstring): SIGINT is ignored, a SIGTERM
    is held until the block ends. Outside the main thread this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN),
                signal.SIGTERM: signal.signal(signal.SIGTERM, lambda signum, frame: caught.append(signum))}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if caught:
        signal.raise_signal(caught[0])  # now acted on by the handler outside the block
