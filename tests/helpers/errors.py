"""Bad input: the same error on every rank, and the communicator usable afterwards."""

from __future__ import annotations

import numpy as np

import zcoll
from helpers import all_ranks_agree


def outcome(fn) -> tuple[str, str]:
    try:
        fn()
    except (TypeError, ValueError, OSError, zcoll.PeerError) as exc:
        return type(exc).__name__, str(exc)
    return "ok", ""


def expect_everywhere(comm, fn, exc_type: type, *, fragment: str = "") -> None:
    """fn() raises exc_type on every rank (message containing `fragment`), and afterwards the
    communicator still works and arrays that took no part are intact."""
    bystander = zcoll.empty(comm, 64, np.int64)
    bystander[:] = np.arange(64) + comm.rank
    kind, message = outcome(fn)
    ok = kind == exc_type.__name__ and fragment in message
    all_ranks_agree(
        comm, ok, f"expected {exc_type.__name__} with {fragment!r}, got {kind}: {message}"
    )
    all_ranks_agree(comm, np.array_equal(bystander, np.arange(64) + comm.rank), "bystander changed")
    after = zcoll.alltoall(comm, np.full((comm.size, 2), comm.rank, np.int32))
    all_ranks_agree(comm, bool((after == np.arange(comm.size)[:, None]).all()), "next call")


def last(comm) -> bool:
    return comm.rank == comm.size - 1
