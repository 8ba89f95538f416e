"""Shared fixtures for zcoll's tests; the suite runs both alone and under mpiexec.

Every rank runs every test in the same order, so a test is collective: anything it skips, it
skips on every rank. Assertions about collective results go through `all_ranks_agree`, so that a
wrong result on one rank fails the test on every rank and the ranks stay in step.

A watchdog (faulthandler) dumps every thread's stack and exits if one test takes longer than
ZCOLL_TEST_WATCHDOG seconds (default 300): one stuck rank cannot stall CI, and mpiexec then
tears the job down.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import sys

import numpy as np
import pytest
from mpi4py import MPI

import zcoll
from zcoll import _context

WATCHDOG_SECONDS = float(os.environ.get("ZCOLL_TEST_WATCHDOG", "300"))
#: Environment prefixes of the MPI launchers: a process a test starts must not see them, or it
#: takes itself for a rank of the job that runs the suite (which may be mpiexec -n 1).
LAUNCHER_PREFIXES = ("OMPI_", "PMIX_", "ORTE_", "OPAL_", "PMI_", "HYDRA_", "MPI_LOCALRANKID")


def launcher_free_env(**extra: str) -> dict[str, str]:
    """This process's environment without the launcher's variables, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES)}
    env.update(extra)
    return env


# Fail fast in tests: a missing peer is reported after 20 s rather than the default 60 s.
zcoll.set_timeout(float(os.environ.get("ZCOLL_TEST_TIMEOUT", "20")))


@pytest.fixture(autouse=True)
def watchdog():
    faulthandler.dump_traceback_later(WATCHDOG_SECONDS, exit=True, file=sys.stderr)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="session")
def world() -> MPI.Intracomm:
    return MPI.COMM_WORLD


def all_ranks_agree(comm: MPI.Comm, ok: bool, what: str = "") -> None:
    """Assert `ok` on every rank of `comm`, naming the ranks where it failed."""
    oks = comm.allgather(bool(ok))
    bad = [r for r, v in enumerate(oks) if not v]
    assert not bad, f"failed on rank(s) {bad}: {what}"


# --- zcoll.fft: expected values written out independently of zcoll.fft ---------------------


def global_array(shape, dtype, seed: int = 0) -> np.ndarray:
    """The same seeded array on every rank."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal(shape)
    return a.astype(dtype)


def abs_err(got, ref) -> float:
    got, ref = np.asarray(got), np.asarray(ref)
    if got.shape != ref.shape:
        return np.inf
    return float(np.abs(got - ref).max()) if got.size else 0.0


def rel_err(got, ref) -> float:
    """Largest error relative to the largest value of `ref` (inf for another shape)."""
    got, ref = np.asarray(got), np.asarray(ref)
    if got.shape != ref.shape:
        return np.inf
    if not got.size:
        return 0.0
    return float(np.abs(got - ref).max()) / max(float(np.abs(ref).max()), 1e-300)


def block(n: int, p: int, r: int) -> slice:
    """mpi4py-fft's block distribution: the first n % p ranks hold one more element."""
    start = r * (n // p) + min(r, n % p)
    return slice(start, start + n // p + (r < n % p))


def tiles(comm, global_shape, dims, local_slice) -> bool:
    """The ranks' slices cover the global array exactly once, each axis in mpi4py-fft blocks
    over `dims` processes."""
    everyone = comm.allgather(tuple((s.start, s.stop) for s in local_slice))
    count = np.zeros(global_shape, np.int64)
    for part in everyone:
        count[tuple(slice(*s) for s in part)] += 1
    ok = bool((count == 1).all())
    for k, (n, p) in enumerate(zip(global_shape, dims)):
        blocks = {(b.start, b.stop) for b in (block(n, p, r) for r in range(p))}
        ok &= {part[k] for part in everyone} == blocks
    return ok


def collapsed(groups: list[list[int]], dims) -> list[list[int]]:
    """mpi4py-fft's collapse: every group of axes local on input joins the first-transformed."""
    merged: list[list[int]] = [[]]
    for g in reversed(groups):
        if all(dims[a] == 1 for a in g):
            merged[0] = g + merged[0]
        else:
            merged.insert(0, g)
    return merged


@pytest.fixture
def plans():
    """make(comm, shape, ...) builds a zcoll.fft.PFFT; every plan built is destroyed after the
    test."""
    from zcoll.fft import PFFT

    made = []

    def make(*args, **kwargs):
        plan = PFFT(*args, **kwargs)
        made.append(plan)
        return plan

    yield make
    for plan in reversed(made):
        plan.destroy()


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


@pytest.fixture(params=sorted(COMM_KINDS))
def comm(request, world):
    """Each communicator kind zcoll must support; freed after the test where it was created."""
    c = COMM_KINDS[request.param](world)
    yield c
    if c not in (MPI.COMM_WORLD, MPI.COMM_SELF):
        c.Free()


#: How calls move buffers outside shared memory (plain NumPy arrays): pulled by CMA at any
#: size, or staged through the arena at any size.
PRIVATE_PATHS = ("cma", "staged")


@contextlib.contextmanager
def private_buffers_by(comm: MPI.Comm, path: str):
    """Within the block, calls on `comm` (collective: every rank enters) move plain NumPy
    buffers by `path` (see PRIVATE_PATHS) whatever their size, instead of the measured rule."""
    core = _context.context(comm).core
    before = core.cma_bytes
    core.cma_bytes = 0 if path == "cma" else 2**62
    try:
        yield
    finally:
        core.cma_bytes = before


def random_bytes(seed: int, nbytes: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


# Every NumPy dtype family: bool, signed/unsigned ints, floats, complex.
DTYPES = [
    np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
    np.float16, np.float32, np.float64, np.longdouble, np.complex64, np.complex128,
    np.clongdouble,
]  # fmt: skip
