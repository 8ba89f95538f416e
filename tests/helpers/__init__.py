"""Helpers shared by zcoll's test modules (fixtures live in the conftest.py files).

Every rank runs every test in the same order, so a test is collective: assertions about
collective results go through `all_ranks_agree`, so that a wrong result on one rank fails the
test on every rank and the ranks stay in step.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap

import numpy as np
from mpi4py import MPI

from zcoll import _context

#: Environment prefixes of the MPI launchers: a process a test starts must not see them, or it
#: takes itself for a rank of the job that runs the suite (which may be mpiexec -n 1).
LAUNCHER_PREFIXES = ("OMPI_", "PMIX_", "ORTE_", "OPAL_", "PMI_", "HYDRA_", "MPI_LOCALRANKID")


def launcher_free_env(**extra: str) -> dict[str, str]:
    """This process's environment without the launcher's variables, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES)}
    env.update(extra)
    return env


def fresh_python(code: str, **env: str) -> subprocess.CompletedProcess:
    """Run `code` (dedented) in a fresh Python process that is not a rank of this job, MPI not
    initialised at import (MPI4PY_RC_INITIALIZE=0), no ZCOLL_ variable but `env`'s."""
    environ = {k: v for k, v in launcher_free_env().items() if not k.startswith("ZCOLL_")}
    environ.update(MPI4PY_RC_INITIALIZE="0", **env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environ,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def all_ranks_agree(comm: MPI.Comm, ok: bool, what: str = "") -> None:
    """Assert `ok` on every rank of `comm`, naming the ranks where it failed."""
    oks = comm.allgather(bool(ok))
    bad = [r for r, v in enumerate(oks) if not v]
    assert not bad, f"failed on rank(s) {bad}: {what}"


def _split_reversed(comm):
    return comm.Split(0, key=comm.size - 1 - comm.rank)


def _split_halves(comm):
    return comm.Split(comm.rank % 2, key=comm.rank)


COMM_KINDS = {
    "world": lambda c: c,
    "dup": lambda c: c.Dup(),
    "split_reversed": _split_reversed,
    "split_halves": _split_halves,
    "self": lambda c: MPI.COMM_SELF,
}


#: How calls move buffers outside shared memory (plain NumPy arrays): pulled by CMA at any
#: size, or staged through the arena at any size.
PRIVATE_PATHS = ("cma", "staged")

# Which buffers of a call are in the arena, by name: none, the receive or the send buffer
# only, or both on rank 0 and none elsewhere (ranks that differ).
ARENA_SIDES = ("private", "send private", "receive private", "by rank")


def arena_sides(buffers: str, rank: int) -> tuple[bool, bool]:
    """Whether this rank's (send, receive) buffers are in the arena under `buffers`
    (one of ARENA_SIDES)."""
    return {
        "private": (False, False),
        "send private": (False, True),
        "receive private": (True, False),
        "by rank": (rank == 0, rank == 0),
    }[buffers]


@contextlib.contextmanager
def private_buffers_by(comm: MPI.Comm, path: str):
    """Within the block, calls on `comm` (collective: every rank enters) move plain NumPy
    buffers by `path` (see PRIVATE_PATHS) whatever their size, instead of the measured rule
    (which also sends plain buffers a little past the eager size through the eager slots).
    By CMA, the irregular calls' senders also push parts of any size into busy receivers
    (split_pulls), however small."""
    core = _context.context(comm).core
    before = core.cma_bytes, core.private_slots, core.cma_push_bytes
    core.cma_bytes = 0 if path == "cma" else 2**62
    core.private_slots = False
    core.cma_push_bytes = 0
    try:
        yield
    finally:
        core.cma_bytes, core.private_slots, core.cma_push_bytes = before


def random_bytes(seed: int, nbytes: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


# Every NumPy dtype family: bool, signed/unsigned ints, floats, complex.
DTYPES = [
    np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
    np.float16, np.float32, np.float64, np.longdouble, np.complex64, np.complex128,
    np.clongdouble,
]  # fmt: skip

#: From this many ranks up, byte-moving collectives' tests run one dtype per item size
#: (dtypes_for).
FEWER_DTYPES_FROM = 4


def dtypes_for(comm) -> list:
    """The dtypes a test of a collective that moves bytes (alltoall, allgather, their plans)
    runs over on `comm`: every family of DTYPES below FEWER_DTYPES_FROM ranks, and above, the
    first dtype of each item size. Such a collective sees a dtype only as its item size, so
    dtypes of one size take one path at every P; the runs at P = 1-3 check every family, and
    every block order, count and buffer kind still runs at every P. This halves the suite's
    time at P = 8, where each call of an oversubscribed job costs a scheduler slice."""
    if comm.size < FEWER_DTYPES_FROM:
        return list(DTYPES)
    first: dict[int, type] = {}
    for dtype in DTYPES:
        first.setdefault(np.dtype(dtype).itemsize, dtype)
    return list(first.values())


# Under tests/run_mpi.py --sanitize: ASan's allocator keeps freed memory in quarantine, so RSS
# says nothing about zcoll's leaks there (the arena's own accounting still does).
SANITIZED = bool(os.environ.get("ZCOLL_TESTS_SANITIZED"))


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
