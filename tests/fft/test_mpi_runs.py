"""A Transfer's runs through MPI on a communicator without a context (zcoll.fft._mpi_runs):
bit for bit the global array's slices, nothing made meanwhile, the switch to zcoll after the
rule's count, errors on every rank with nothing written, the bounded wait -- over both
transports (the extension's own MPI, and mpi4py for a build without one)."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import zcoll
from helpers import all_ranks_agree
from helpers.pencil import global_array, outcome
from zcoll import _context, _core, _transport
from zcoll.fft import _mpi_runs
from zcoll.fft import pencil as pencil_module
from zcoll.fft.pencil import Pencil, Subcomm

SHAPES = [((9, 7), 1, 0), ((6, 5, 4), 2, 0), ((5, 8, 3), 0, 1)]


@pytest.fixture(params=["extension", "mpi4py"])
def transport(request, monkeypatch):
    """The runs' transport: the extension's MPI (where it is mpi4py's, as the build makes it)
    or mpi4py's, as a build without MPI in the extension takes."""
    extension = request.param == "extension"
    if extension and not _core.mpi_library_matches(MPI.Get_library_version()):
        pytest.skip("the extension has no MPI of its own, or not mpi4py's")
    monkeypatch.setattr(_mpi_runs, "_extension_mpi", lambda: extension)
    _mpi_runs._transpose.cache_clear()  # its objects are of one transport
    yield request.param
    _mpi_runs._transpose.cache_clear()


def pencils(world, shape, axis_a: int, axis_b: int):
    """(subcomm, pencil aligned in axis_a, pencil aligned in axis_b) over a fresh grid: every
    rank along axis_b, so the transfer between them runs over all of `world`'s ranks."""
    dims = [1] * len(shape)
    dims[axis_b] = 0
    sub = Subcomm(world, dims)
    pa = Pencil(sub, shape, axis_a)
    return sub, pa, pa.pencil(axis_b)


@pytest.mark.parametrize("dtype", [np.float64, np.complex64, np.int16])
@pytest.mark.parametrize("case", range(len(SHAPES)))
def test_runs_through_mpi_then_zcoll(world, case, dtype, transport):
    """The rule's runs through MPI move the global array's slices and make nothing (no
    context, no work arrays, no plan); the runs after them are zcoll's, with the same results."""
    shape, axis_a, axis_b = SHAPES[case]
    sub, pa, pb = pencils(world, shape, axis_a, axis_b)
    g = global_array(shape, dtype, case)
    t = pa.transfer(pb, dtype)
    p = t.comm.size
    cold = _core.cold_transfer_runs(int(np.prod(shape)) * np.dtype(dtype).itemsize // p)
    ok = 2 <= cold < 1000 and t._mpi is not None  # small arrays: a few runs on MPI, then zcoll
    before = dict(pencil_module.made)
    runs = 0
    for run in range(cold + 3):
        a = np.ascontiguousarray(g[pa.local_slice()]) * (run + 1)
        b = np.zeros(pb.subshape, dtype)
        ok &= t.forward(a, b) is b and np.array_equal(b, g[pb.local_slice()] * (run + 1))
        a[...] = 0
        ok &= t.backward(b, a) is a and np.array_equal(a, g[pa.local_slice()] * (run + 1))
        runs += 2
        through_mpi = p == 1 or runs <= cold
        ok &= (pencil_module.made == before) == through_mpi
        ok &= _context.has_context(t.comm) != through_mpi
    t.destroy()
    sub.destroy()
    all_ranks_agree(world, ok, f"{shape} {np.dtype(dtype)}: {cold} runs through MPI, then zcoll")


def test_one_rank_copies_and_makes_nothing(world):
    sub, pa, pb = pencils(MPI.COMM_SELF, (6, 4), 1, 0)
    t = pa.transfer(pb, float)
    a = np.arange(24.0).reshape(6, 4)
    b = np.zeros((6, 4))
    before = dict(pencil_module.made)
    for _ in range(100):
        t.forward(a, b)
    ok = np.array_equal(a, b) and pencil_module.made == before
    ok &= not _context.has_context(t.comm)
    t.destroy()
    sub.destroy()
    all_ranks_agree(world, ok, "a one-rank transfer is a copy")


@pytest.mark.parametrize("wrong", ["shape", "dtype", "read-only", "leading axes"])
def test_bad_array_on_one_rank_raises_everywhere(world, wrong, transport):
    """One rank's array does not suit a run through MPI: every rank takes zcoll's path, whose
    checks raise on every rank (ValueError or TypeError), and no rank's result is written."""
    if world.size == 1:
        pytest.skip("one rank: nothing to disagree with")
    sub, pa, pb = pencils(world, (8, 6), 1, 0)
    t = pa.transfer(pb, float)
    a = np.ones(pa.subshape)
    b = np.full(pb.subshape, 7.0)
    mine_a, mine_b = a, b
    if world.rank == 0:
        if wrong == "shape":
            mine_b = np.full((pb.subshape[0] + 1, *pb.subshape[1:]), 7.0)
        elif wrong == "dtype":
            mine_b = np.full(pb.subshape, 7, np.float32)
        elif wrong == "read-only":
            mine_b = b.copy()
            mine_b.flags.writeable = False
        else:
            mine_a, mine_b = np.ones((2, *pa.subshape)), np.full((2, *pb.subshape), 7.0)
    kept = mine_b.copy()
    kind, result = outcome(lambda: t.forward(mine_a, mine_b))
    ok = kind in ("ValueError", "TypeError") and np.array_equal(mine_b, kept)
    all_ranks_agree(world, ok, f"{wrong} on rank 0: {kind}: {result}")
    t.forward(a, b)  # still usable
    all_ranks_agree(world, bool((b == 1).all()), f"{wrong}: a good run after the error")
    t.destroy()
    sub.destroy()


def test_a_wait_gives_up_with_peer_error(monkeypatch):
    """A run through MPI waits at most the zcoll timeout, then raises PeerError, keeping the
    unfinished request and the buffers it may still write alive."""
    buffer = np.zeros(1)
    request = MPI.COMM_SELF.Irecv(buffer, source=0, tag=77)  # never sent
    previous = zcoll.get_timeout()
    zcoll.set_timeout(0.2)
    try:
        with pytest.raises(_core.PeerError, match="did not take part within 0.2 s"):
            _transport.wait_bounded(request, 0, "a test", (buffer,))
        kept_request, kept = _transport._abandoned[-1]
        assert kept_request is request and kept[0] is buffer
    finally:
        zcoll.set_timeout(previous)
        request.Cancel()
        request.Wait()


def test_a_run_of_the_extension_gives_up_with_peer_error(world):
    """A run through the extension's MPI that a peer does not join waits at most the zcoll
    timeout, then raises PeerError on the rank that waited, keeping the arrays MPI may still
    write; the peer's late agreement then completes it in the background."""
    if world.size == 1:
        pytest.skip("one rank: no peer to wait for")
    if not _core.mpi_library_matches(MPI.Get_library_version()):
        pytest.skip("the extension has no MPI of its own, or not mpi4py's")
    comm = world.Dup()
    n = 2 * comm.size
    runs = _mpi_runs.MpiRuns(comm, np.dtype(float), (n, n), ((2, n), (n, 2)), (1, 0))
    a, b = np.ones((2, n)), np.zeros((n, 2))
    kind, message, kept = "none", "", False
    if comm.rank == 0:
        previous = zcoll.get_timeout()
        zcoll.set_timeout(0.2)
        try:
            kind, error = outcome(lambda: runs.run(a, b, 0))
            message = str(error)
            kept = any(keep and keep[0] is a and keep[1] is b for _, keep in _transport._abandoned)
        finally:
            zcoll.set_timeout(previous)
    world.Barrier()
    if comm.rank != 0:
        _mpi_runs.agree_min(comm, 0, "a late peer")  # the agreement rank 0 gave up on
    world.Barrier()
    comm.Free()
    ok = world.rank != 0 or (
        kind == "PeerError" and "did not take part within 0.2 s" in message and kept
    )
    all_ranks_agree(world, ok, f"{kind}: {message}")
