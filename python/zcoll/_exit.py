"""Exit handling: a rank that leaves tells the peers of every live context at once.

Its script ends or calls ``sys.exit`` (an ``atexit`` hook), an exception goes uncaught (a
``sys.excepthook`` wrapper), or ``mpiexec`` ends the job with SIGTERM (a handler in the
extension): the engine writes the reason into each context's control segment, so peers waiting
for this rank raise PeerError at once rather than after the timeout -- the process itself may
live on in ``MPI_Finalize``, where no liveness check can see that it left. The hooks are
installed when the first context is made (:func:`install`), so importing zcoll changes none.
"""

from __future__ import annotations

import atexit
import signal
import sys
import threading
from typing import Callable

from . import _core

__all__ = ["install"]

_lock = threading.Lock()
_installed = False
_previous_excepthook = sys.excepthook


def install(close_contexts: Callable[[], None]) -> None:
    """Install the exit hooks, once per process; at exit they announce the departure, then
    call `close_contexts`."""
    global _installed, _previous_excepthook
    with _lock:
        if _installed:
            return
        _installed = True
        # mpi4py finalizes MPI from Py_AtExit, after every atexit handler: this one runs first.
        atexit.register(_at_exit, close_contexts)
        _previous_excepthook = sys.excepthook
        sys.excepthook = _announce_uncaught
        # mpiexec ends a job with SIGTERM: the handler announces the departure, then hands the
        # signal on (to a Python handler installed before it, or the default action).
        _core.install_departure_handler(signal.SIGTERM)


def _at_exit(close_contexts: Callable[[], None]) -> None:
    # Peers still waiting for this rank (it leaves with them inside a collective) learn it now,
    # not after their timeout: the process lives on in MPI_Finalize, where no liveness check
    # can see that it left.
    _core.depart_everywhere(_core.DEPARTED_EXITED, "")
    close_contexts()


def _announce_uncaught(exc_type, exc, tb) -> None:
    """sys.excepthook: the departure, with the exception's type, then the previous hook. Not
    at an interactive prompt, where an uncaught exception does not end the interpreter."""
    if not hasattr(sys, "ps1"):
        name = getattr(exc_type, "__name__", "exception")
        _core.depart_everywhere(_core.DEPARTED_EXCEPTION, name)
    _previous_excepthook(exc_type, exc, tb)
