"""Collectives on the shared heap (zcoll.use_shared_heap): heap arrays on both sides, or one
side heap and the other plain or arena, bit for bit against mpi4py's on the same data: alltoall,
allgather, the v-variants, the reductions, bcast and plans; a job whose rank is SIGKILLed
mid-loop on heap arrays (it starts its own mpiexec job). The heap's process semantics are in
test_heap_process.py.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
from mpi4py import MPI

import zcoll
from helpers import all_ranks_agree
from helpers import vcoll_reference as ref
from helpers.jobs import alone, check_job_with_killed_rank, killing_job
from zcoll import _core

SIZES = [0, 1, 100, 3000, 70_001]  # elements per block: eager, staged-size and large calls
HEAP_SMALLEST = 1024  # bytes: smaller requests stay with NumPy's allocator (heap.hpp)


def heap_array(shape, dtype, seed: int) -> np.ndarray:
    with zcoll.use_shared_heap():
        a = np.empty(shape, dtype)
    a.reshape(-1).view(np.uint8)[:] = np.random.default_rng(seed).integers(
        0, 256, a.nbytes, dtype=np.uint8
    )
    return a


def make(kind: str, comm, shape, dtype, seed: int) -> np.ndarray:
    """A heap, plain or arena array of random bytes (a heap one really in the heap where the
    heap takes its size)."""
    if kind == "heap":
        a = heap_array(shape, dtype, seed)
        assert zcoll.in_heap(a) or a.nbytes < HEAP_SMALLEST, (a.shape, a.dtype)
        return a
    a = np.empty(shape, dtype) if kind == "plain" else zcoll.empty(comm, shape, dtype)
    a.reshape(-1).view(np.uint8)[:] = np.random.default_rng(seed).integers(
        0, 256, a.nbytes, dtype=np.uint8
    )
    return a


def byte_view(a: np.ndarray):
    return [a.reshape(-1).view(np.uint8), MPI.BYTE]


# (send kind, receive kind) of the buffers of a call.
KINDS = [("heap", "heap"), ("heap", "plain"), ("plain", "heap"), ("arena", "heap")]


@pytest.mark.parametrize("kinds", KINDS, ids=lambda k: f"{k[0]}-{k[1]}")
def test_alltoall_and_allgather_match_mpi(comm, kinds):
    p, failures = comm.size, []
    for count in SIZES:
        send = make(kinds[0], comm, (p, count), np.float64, 7 * comm.rank + count)
        recv = make(kinds[1], comm, (p, count), np.float64, 1)
        expected = np.empty_like(send)
        comm.Alltoall(byte_view(send), byte_view(expected))
        zcoll.alltoall(comm, send, recv)
        if recv.tobytes() != expected.tobytes():
            failures.append(("alltoall", count))
        gathered = make(kinds[1], comm, (p, count), np.float64, 2)
        comm.Allgather(byte_view(send[0]), byte_view(expected))
        zcoll.allgather(comm, send[0], gathered)
        if gathered.tobytes() != expected.tobytes():
            failures.append(("allgather", count))
    all_ranks_agree(comm, not failures, f"{kinds}: {failures}")


@pytest.mark.parametrize("kinds", KINDS, ids=lambda k: f"{k[0]}-{k[1]}")
def test_irregular_calls_match_mpi(comm, kinds):
    p, me, failures = comm.size, comm.rank, []
    for scale in (1, 5000):
        counts = [(me + j) % 3 * scale for j in range(p)]  # what rank me sends to rank j
        rcounts = [(j + me) % 3 * scale for j in range(p)]
        send = make(kinds[0], comm, (sum(counts),), np.int32, me + scale)
        recv = make(kinds[1], comm, (sum(rcounts),), np.int32, 3)
        expected = np.empty_like(recv)
        comm.Alltoallv([send, counts], [expected, rcounts])
        zcoll.alltoallv(comm, [send, counts], [recv, rcounts])
        if recv.tobytes() != expected.tobytes():
            failures.append(("alltoallv", scale))
        sizes = [(j % 2 + 1) * scale for j in range(p)]
        mine = send[: sizes[me]] if send.size >= sizes[me] else np.resize(send, sizes[me])
        out = make(kinds[1], comm, (sum(sizes),), np.int32, 4)
        expected = np.empty_like(out)
        comm.Allgatherv(mine, [expected, sizes])
        zcoll.allgatherv(comm, mine, [out, sizes])
        if out.tobytes() != expected.tobytes():
            failures.append(("allgatherv", scale))
    all_ranks_agree(comm, not failures, f"{kinds}: {failures}")


@pytest.mark.parametrize("kinds", KINDS, ids=lambda k: f"{k[0]}-{k[1]}")
def test_reductions_and_bcast_match_mpi(comm, kinds):
    p, failures = comm.size, []
    for n in (1, 1000, 300_000):
        x = make(kinds[0], comm, (n * p,), np.int64, comm.rank + n)
        np.remainder(x, 1000, out=x)  # in place: x stays the array of its kind
        out = make(kinds[1], comm, (n * p,), np.int64, 5)
        expected = np.empty_like(out)
        comm.Allreduce(x, expected)
        zcoll.allreduce(comm, x, out)
        if not np.array_equal(out, expected):
            failures.append(("allreduce", n))
        out[...] = x
        zcoll.allreduce(comm, zcoll.IN_PLACE, out)
        if not np.array_equal(out, expected):
            failures.append(("allreduce in place", n))
        root = (n + 1) % p
        at_root = make(kinds[1], comm, (n * p,), np.int64, 9)
        untouched = at_root.copy()
        zcoll.reduce(comm, x, at_root, root=root)
        want = expected if comm.rank == root else untouched
        if not np.array_equal(at_root, want):
            failures.append(("reduce", n))
        part = make(kinds[1], comm, (n,), np.int64, 6)
        expected = np.empty_like(part)
        comm.Reduce_scatter_block(x, expected)
        zcoll.reduce_scatter_block(comm, x, part)
        if not np.array_equal(part, expected):
            failures.append(("reduce_scatter_block", n))
        buf = make(kinds[1], comm, (n,), np.int64, 8 + comm.rank)
        root_data = buf.copy()
        comm.Bcast(root_data, root=p - 1)
        zcoll.bcast(comm, buf, root=p - 1)
        if not np.array_equal(buf, root_data):
            failures.append(("bcast", n))
    all_ranks_agree(comm, not failures, f"{kinds}: {failures}")


def test_plans_on_heap_arrays(comm):
    p = comm.size
    send = heap_array((p, 40_000), np.float64, comm.rank)
    recv = heap_array((p, 40_000), np.float64, 9)
    ok = True
    with zcoll.alltoall_init(comm, send, recv) as plan:
        for run in range(3):
            send[...] = np.arange(send.size).reshape(send.shape) + 1e6 * comm.rank + run
            expected = np.empty_like(send)
            comm.Alltoall(send, expected)
            plan()
            ok &= recv.tobytes() == expected.tobytes()
    all_ranks_agree(comm, ok, "plan on heap arrays")


@pytest.mark.parametrize("kinds", KINDS, ids=lambda k: f"{k[0]}-{k[1]}")
def test_irregular_plans_on_heap_arrays(comm, kinds):
    """allgather_init, alltoallv_init and allgatherv_init on heap arrays (one side or both),
    three runs each with new send data written in between, against mpi4py's calls."""
    p, me, failures = comm.size, comm.rank, []
    send = make(kinds[0], comm, (p, 3000), np.float64, me)
    gathered = make(kinds[1], comm, (p, 3000), np.float64, 1)
    counts = [(me + j) % 3 * 2000 for j in range(p)]
    rcounts = [(j + me) % 3 * 2000 for j in range(p)]
    vsend = make(kinds[0], comm, (sum(counts),), np.int32, me + 7)
    vrecv = make(kinds[1], comm, (sum(rcounts),), np.int32, 2)
    sizes = [(j % 2 + 1) * 1500 for j in range(p)]
    mine = make(kinds[0], comm, (sizes[me],), np.int32, me + 9)
    vgathered = make(kinds[1], comm, (sum(sizes),), np.int32, 3)
    with (
        zcoll.allgather_init(comm, send[0], gathered) as allgather,
        zcoll.alltoallv_init(comm, [vsend, counts], [vrecv, rcounts]) as alltoallv,
        zcoll.allgatherv_init(comm, mine, [vgathered, sizes]) as allgatherv,
    ):
        for run in range(3):
            for a in (send, vsend, mine):
                a[...] = np.random.default_rng([run, me, a.size]).integers(0, 1000, a.shape)
            expected = np.empty_like(gathered)
            comm.Allgather(send[0], expected)
            allgather()
            if gathered.tobytes() != expected.tobytes():
                failures.append(("allgather_init", run))
            expected = np.empty_like(vrecv)
            comm.Alltoallv([vsend, counts], [expected, rcounts])
            alltoallv()
            if vrecv.tobytes() != expected.tobytes():
                failures.append(("alltoallv_init", run))
            expected = np.empty_like(vgathered)
            comm.Allgatherv(mine, [expected, sizes])
            allgatherv()
            if vgathered.tobytes() != expected.tobytes():
                failures.append(("allgatherv_init", run))
    all_ranks_agree(comm, not failures, f"{kinds}: {failures}")


def test_plans_hold_their_heap_buffers(comm):
    """A plan over heap arrays keeps them: even ranks drop their references (one while a run is
    in flight) and allocate heap arrays of the same sizes, which would reuse the memory had the
    plan let it go; every run still moves the data it was made for."""
    p, me = comm.size, comm.rank
    send = heap_array((p, 20_000), np.int64, me)
    send[...] = np.arange(p)[:, None] + 100 * me
    recv = heap_array((p, 20_000), np.int64, 1)
    plan = zcoll.alltoall_init(comm, send, recv)
    want = np.repeat(100 * np.arange(p)[:, None] + me, 20_000, axis=1)
    plan.start()
    if me % 2 == 0:
        del send, recv
        gc.collect()
    plan.wait()
    junk = [heap_array((p, 20_000), np.int64, 9) for _ in range(4)] if me % 2 == 0 else []
    ok = all(np.array_equal(plan(), want) for _ in range(3))
    plan.free()
    del junk
    all_ranks_agree(comm, ok, "a plan after its caller dropped its heap arrays")


# Topologies of the neighbourhood calls (tests/helpers/vcoll_reference.py): a periodic grid,
# whose dimensions of 1 or 2 repeat a neighbour, and a seeded multigraph with self-loops.
NEIGHBOURHOODS = ["cart2d_periodic", "graph_adjacent"]


def neighbourhood_failures(comm, kinds, n: int) -> list:
    """The four neighbourhood calls on arrays of `kinds`, blocks of about `n` float64, against
    MPI's own or, where this MPI breaks the standard there, point-to-point."""
    indeg, outdeg = ref.degrees(comm)
    me, failures = comm.rank, []

    def check(name, call, send, recv, reference, *args):
        expected = recv.copy()
        reference(comm, send, *args[:1], expected, *args[1:])
        call()
        if not ref.same_bits(recv, expected):
            failures.append((name, n, ref.first_difference(recv, expected)))

    send = make(kinds[0], comm, (outdeg, n), np.float64, me + n)
    recv = make(kinds[1], comm, (indeg, n), np.float64, 1)
    check("neighbor_alltoall", lambda: zcoll.neighbor_alltoall(comm, send, recv), send, recv,
          lambda c, s, e: ref.neighbor_reference("alltoall")(c, s, e, n))  # fmt: skip
    mine = make(kinds[0], comm, (n,), np.float64, me + 2 * n)
    recv = make(kinds[1], comm, (indeg, n), np.float64, 2)
    check("neighbor_allgather", lambda: zcoll.neighbor_allgather(comm, mine, recv), mine, recv,
          ref.neighbor_reference("allgather"))  # fmt: skip
    rng = np.random.default_rng([n, me])
    scounts, rcounts = ref.edge_counts(comm, np.random.default_rng(n), rng, high=n)
    sdispls, ssize = ref.layout(rng, scounts)
    rdispls, rsize = ref.layout(rng, rcounts)
    vsend = make(kinds[0], comm, (ssize,), np.float64, me + 3 * n)
    vrecv = make(kinds[1], comm, (rsize,), np.float64, 3)
    check("neighbor_alltoallv",
          lambda: zcoll.neighbor_alltoallv(comm, [vsend, (scounts, sdispls)],
                                           [vrecv, (rcounts, rdispls)]),
          vsend, vrecv,
          lambda c, s, e: ref.neighbor_reference("alltoallv")(c, s, scounts, sdispls, e,
                                                               rcounts, rdispls))  # fmt: skip
    sources = ref.neighbour_lists(comm)[0]
    gcounts = np.array([n + 7 * (me if s == MPI.PROC_NULL else s) for s in sources], np.int64)
    gdispls, gsize = ref.layout(rng, gcounts)
    mine = make(kinds[0], comm, (n + 7 * me,), np.float64, me + 4 * n)
    vrecv = make(kinds[1], comm, (gsize,), np.float64, 4)
    check("neighbor_allgatherv",
          lambda: zcoll.neighbor_allgatherv(comm, mine, [vrecv, (gcounts, gdispls)]),
          mine, vrecv,
          lambda c, s, e: ref.neighbor_reference("allgatherv")(c, s, s.size, e, gcounts,
                                                                gdispls))  # fmt: skip
    return failures


@pytest.mark.parametrize("kinds", KINDS, ids=lambda k: f"{k[0]}-{k[1]}")
@pytest.mark.parametrize("topo", NEIGHBOURHOODS)
def test_neighbourhood_calls_match_mpi(world, topo, kinds):
    """neighbor_alltoall, neighbor_allgather and their v-variants on heap arrays (one side or
    both), blocks of 3 elements (the eager path) and of 5000 (mapped peers' heap buffers, or
    pulled plain ones), bit for bit against MPI or point-to-point."""
    comm = ref.make_topology(world, topo)
    if comm is None:
        pytest.skip(f"{topo} does not fit {world.size} ranks")
    failures = []
    try:
        if comm != MPI.COMM_NULL:
            for n in (3, 5000):
                failures += neighbourhood_failures(comm, kinds, n)
    finally:
        if comm != MPI.COMM_NULL:
            comm.Free()
    all_ranks_agree(world, not failures, f"{topo} {kinds}: {failures}")


def test_freed_segments_are_never_read_through_a_stale_mapping(comm):
    """Even ranks free their heap arrays after each call, given back at once (nothing kept),
    and make new ones: their segments reuse the freed descriptors under new generations, which
    the odd ranks, whose own arrays stay and who mapped (and remember) the old segments, must
    map anew."""
    p = comm.size
    renew = comm.rank % 2 == 0
    count = -(-150_000 // p)  # over 1 MiB: a segment each
    limits = _core.heap_stats()
    _core.set_heap_limits(limits["small_bytes"], limits["large_bytes"], keep_total_bytes=0)
    try:
        ok = True
        send = heap_array((p, count), np.float64, 0)
        recv = heap_array((p, count), np.float64, 0)
        for run in range(6):
            if renew:
                del send, recv
                send = heap_array((p, count), np.float64, 100 * run + comm.rank)
                recv = heap_array((p, count), np.float64, 7)
            else:  # in place: no heap array made or freed on this rank
                send.reshape(-1).view(np.uint8)[:] = np.random.default_rng(
                    100 * run + comm.rank
                ).integers(0, 256, send.nbytes, dtype=np.uint8)
            ok &= zcoll.in_heap(send) and zcoll.in_heap(recv)
            expected = np.empty_like(send)
            comm.Alltoall(send, expected)
            zcoll.alltoall(comm, send, recv)
            ok &= recv.tobytes() == expected.tobytes()
    finally:
        _core.set_heap_limits(limits["small_bytes"], limits["large_bytes"])
    all_ranks_agree(comm, ok, "calls on heap arrays made after others were freed")


KILL_JOB = killing_job(
    setup="""
    zcoll.use_shared_heap()
    n = 8192  # float64 per block: 64 KiB, well inside the heap
    """,
    step="""
    send = np.full((p, n), float(rank * 1000 + i))  # a new heap array each time
    recv = np.empty_like(send)
    assert zcoll.in_heap(send) and zcoll.in_heap(recv)
    zcoll.alltoall(comm, send, recv)
    assert (recv == (np.arange(p) * 1000 + i)[:, None]).all()
    total = zcoll.allreduce(comm, send[0])
    assert (total == sum(r * 1000 + i for r in range(p))).all()
    """,
    iterations=2000,
    kill_at=300,
)


@alone
def test_job_with_a_killed_rank_holding_heap_arrays(tmp_path):
    """One of 3 ranks SIGKILLs itself in a loop of collectives on fresh shared-heap arrays,
    whose memory its peers map: the survivors raise PeerError saying it died (no SIGBUS on
    the mapped memory of the dead rank, no timeout), and nothing of the job is left in
    /dev/shm."""
    check_job_with_killed_rank(tmp_path, KILL_JOB, 1)
