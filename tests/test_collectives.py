"""alltoall and allgather, bit for bit against mpi4py's own collectives.

Seeded random bytes (so every bit pattern, NaNs included) of every dtype family (from 4 ranks
up, every item size: helpers.dtypes_for), block sizes 0, 1, odd and large, every order, every
communicator kind, arena and private buffers, in place or not. The reference is
`comm.Alltoall` / `comm.Allgather` on byte views of the same data.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np
import pytest
from mpi4py import MPI

import zcoll
from helpers import (
    ARENA_SIDES,
    PRIVATE_PATHS,
    all_ranks_agree,
    arena_sides,
    dtypes_for,
    private_buffers_by,
    random_bytes,
)
from helpers import vcoll_reference as ref
from helpers.collectives import (
    fill,
    make_buffer,
    reference_allgather,
    reference_alltoall,
    same_bits,
    seeded,
)
from zcoll import _collectives, _context, _vcollectives

# "numa" without a NUMA topology is Morton's schedule (test_schedule.py): it runs here under a
# described 4-NUMA-node machine (test_numa_matches_mpi) instead of in every test below.
ORDERS = ["auto", *(o for o in zcoll.ORDERS if o != "numa")]
# 2 packages of 2 NUMA nodes of 2 cores: node ranks 0-1 on NUMA node 0, 2-3 on 1, ...
NUMA_TOPOLOGY = "package:2 numa:2 core:2 pu:1"
COUNTS = [0, 1, 3, 17, 1000]  # elements per block
LARGE_COUNT = 70_001  # ~0.5-1 MiB blocks for 8-16 byte types


@pytest.mark.parametrize("mode", ["arena", "private", "mixed"])
@pytest.mark.parametrize("order", ORDERS)
def test_alltoall_matches_mpi(comm, order, mode):
    p = comm.size
    failures = []
    for tag, (dtype, count) in enumerate((d, c) for d in dtypes_for(comm) for c in COUNTS):
        shape = (p, count)
        send = make_buffer(comm, shape, dtype, arena=mode == "arena")
        recv = make_buffer(comm, shape, dtype, arena=mode != "private")
        fill(send, seeded(comm, tag, send.nbytes))
        expected = reference_alltoall(comm, send)
        got = zcoll.alltoall(comm, send, recv, order=order)
        if got is not recv or not same_bits(got, expected):
            failures.append((np.dtype(dtype).name, count))
    all_ranks_agree(comm, not failures, f"alltoall order={order} mode={mode}: {failures}")


@pytest.mark.parametrize("mode", ["arena", "private"])
@pytest.mark.parametrize("order", ORDERS)
def test_alltoall_in_place_matches_mpi(comm, order, mode):
    p = comm.size
    failures = []
    for tag, (dtype, count) in enumerate((d, c) for d in dtypes_for(comm) for c in COUNTS):
        buf = make_buffer(comm, (p, count), dtype, arena=mode == "arena")
        fill(buf, seeded(comm, tag, buf.nbytes))
        expected = reference_alltoall(comm, buf)
        got = zcoll.alltoall(comm, zcoll.IN_PLACE, buf, order=order)
        if got is not buf or not same_bits(buf, expected):
            failures.append((np.dtype(dtype).name, count))
    all_ranks_agree(comm, not failures, f"in-place alltoall order={order}: {failures}")


@pytest.mark.parametrize("mode", ["arena", "private", "mixed"])
@pytest.mark.parametrize("order", ORDERS)
def test_allgather_matches_mpi(comm, order, mode):
    failures = []
    for tag, (dtype, count) in enumerate((d, c) for d in dtypes_for(comm) for c in COUNTS):
        send = make_buffer(comm, (count,), dtype, arena=mode == "arena")
        recv = make_buffer(comm, (comm.size, count), dtype, arena=mode != "private")
        fill(send, seeded(comm, tag, send.nbytes))
        expected = reference_allgather(comm, send)
        got = zcoll.allgather(comm, send, recv, order=order)
        if got is not recv or not same_bits(got, expected):
            failures.append((np.dtype(dtype).name, count))
    all_ranks_agree(comm, not failures, f"allgather order={order} mode={mode}: {failures}")


# Which of a call's buffers are plain NumPy arrays: (send, receive).
PRIVATE_SIDES = {"both": (True, True), "send": (True, False), "recv": (False, True)}


@pytest.mark.parametrize("sides", PRIVATE_SIDES)
@pytest.mark.parametrize("path", PRIVATE_PATHS)
@pytest.mark.parametrize("op", ["alltoall", "allgather"])
def test_private_buffers_match_mpi(comm, op, path, sides):
    """Plain NumPy buffers pulled by CMA or staged, whatever their size (order "auto"), on one
    side or both: every dtype (dtypes_for) and count, bit for bit."""
    private_send, private_recv = PRIVATE_SIDES[sides]
    p = comm.size
    failures = []
    with private_buffers_by(comm, path):
        for tag, (dtype, count) in enumerate((d, c) for d in dtypes_for(comm) for c in COUNTS):
            send_shape = (p, count) if op == "alltoall" else (count,)
            send = make_buffer(comm, send_shape, dtype, arena=not private_send)
            recv = make_buffer(comm, (p, count), dtype, arena=not private_recv)
            fill(send, seeded(comm, tag, send.nbytes))
            fill(recv, random_bytes(tag, recv.nbytes))
            reference = reference_alltoall if op == "alltoall" else reference_allgather
            expected = reference(comm, send)
            got = getattr(zcoll, op)(comm, send, recv)
            if got is not recv or not same_bits(got, expected):
                failures.append((np.dtype(dtype).name, count))
    all_ranks_agree(comm, not failures, f"{op} {path} private={sides}: {failures}")


@pytest.mark.parametrize("received", [6 << 10, 12 << 10, 24 << 10])
@pytest.mark.parametrize("buffers", ARENA_SIDES)
def test_private_buffers_past_the_eager_size(comm, buffers, received):
    """alltoall and allgather (also in place) receiving 6, 12 and 24 KiB per rank under the
    measured rules: plain buffers up to half the CMA size go through the eager slots, decided
    once every rank has published; beyond it they are staged or pulled; a call whose ranks
    differ (arena on rank 0, plain on the others: "by rank") takes the path they all can,
    after the plain ranks filled their slots for nothing. Bits as MPI's."""
    p, me = comm.size, comm.rank
    count = max(1, received // (8 * p))
    send_arena, recv_arena = arena_sides(buffers, me)

    def array(shape, arena: bool) -> np.ndarray:
        shared = zcoll.empty(comm, shape)  # collective: every rank makes one, some use it
        return shared if arena else np.empty(shape)

    failures = []
    for tag, op in enumerate(("alltoall", "allgather")):
        send = array((p, count) if op == "alltoall" else (count,), send_arena)
        recv = array((p, count), recv_arena)
        fill(send, seeded(comm, tag, send.nbytes))
        fill(recv, random_bytes(tag, recv.nbytes))
        reference = reference_alltoall if op == "alltoall" else reference_allgather
        if not same_bits(getattr(zcoll, op)(comm, send, recv), reference(comm, send)):
            failures.append(op)
        fill(recv, seeded(comm, tag + 2, recv.nbytes))
        expected = (
            reference_alltoall(comm, recv)
            if op == "alltoall"
            else reference_allgather(comm, recv[comm.rank].copy())
        )
        if not same_bits(getattr(zcoll, op)(comm, zcoll.IN_PLACE, recv), expected):
            failures.append(f"{op} in place")
    all_ranks_agree(comm, not failures, f"{buffers}, {received} B received: {failures}")


def test_large_private_blocks(world):
    """~1 MiB blocks between plain NumPy arrays (pulled by CMA under the measured rule)."""
    send = np.empty((world.size, LARGE_COUNT), np.complex128)
    fill(send, seeded(world, 98, send.nbytes))
    recv = np.empty_like(send)
    ok = same_bits(zcoll.alltoall(world, send, recv), reference_alltoall(world, send))
    gathered = np.empty_like(send)
    ok &= same_bits(zcoll.allgather(world, send[1 % world.size], gathered),
                    reference_allgather(world, send[1 % world.size]))  # fmt: skip
    all_ranks_agree(world, ok, "large private blocks")


def test_refused_cma_stages_on_every_rank(world):
    """A kernel that refuses CMA (here: rank 0's peers cannot read the word it publishes) gives
    every rank of rank 0's node the same verdict, naming rank 0 (other nodes' ranks can still
    read each other), and plain buffers are staged instead."""
    comm = world.Dup()
    try:
        ctx = _context.context(comm)
        usable = ctx.core.probe_cma(publish_unmapped=comm.rank == 0)  # probed again
        state, why = ctx.core.cma
        if ctx.node_size == 1 or 0 not in ctx.local_ranks:
            ok = usable and state == "works" and why == ""
        else:
            ok = not usable and state == "refused" and why.startswith("process_vm_readv from")
            ok &= ("rank 0" in why) if comm.rank != 0 else True
        all_ranks_agree(comm, ok, f"{usable} {state}: {why}")
        with private_buffers_by(comm, "cma"):
            send = np.arange(comm.size * 5000, dtype=np.float64) + 1e6 * comm.rank
            send = send.reshape(comm.size, 5000)
            got = zcoll.alltoall(comm, send, np.empty_like(send))
        all_ranks_agree(
            comm, same_bits(got, reference_alltoall(comm, send)), "staged after refusal"
        )
    finally:
        comm.Free()


@pytest.mark.parametrize("mode", ["arena", "private"])
@pytest.mark.parametrize("order", ORDERS)
def test_allgather_in_place_matches_mpi(comm, order, mode):
    failures = []
    for tag, (dtype, count) in enumerate((d, c) for d in dtypes_for(comm) for c in COUNTS):
        mine = seeded(comm, tag, count * np.dtype(dtype).itemsize).view(dtype)
        buf = make_buffer(comm, (comm.size, count), dtype, arena=mode == "arena")
        fill(buf, random_bytes(tag, buf.nbytes))  # garbage everywhere but our own block
        buf[comm.rank] = mine
        expected = reference_allgather(comm, mine)
        got = zcoll.allgather(comm, zcoll.IN_PLACE, buf, order=order)
        if got is not buf or not same_bits(buf, expected):
            failures.append((np.dtype(dtype).name, count))
    all_ranks_agree(comm, not failures, f"in-place allgather order={order}: {failures}")


@pytest.fixture
def numa_world(world, monkeypatch):
    """A duplicate of COMM_WORLD whose context places node rank i on PU i of NUMA_TOPOLOGY."""
    monkeypatch.setenv("ZCOLL_TOPOLOGY", NUMA_TOPOLOGY)
    comm = world.Dup()
    yield comm
    comm.Free()


@pytest.mark.parametrize("order", ["numa", "auto"])
def test_numa_matches_mpi(numa_world, order):
    """SH-NUMA-CO (order="numa", and "auto", which picks it when the node spans NUMA nodes):
    every schedule kind, arena and private buffers, bit for bit against mpi4py."""
    comm = numa_world
    p = comm.size
    failures = []
    cases = [(d, c) for d in (np.uint8, np.float64, np.complex128) for c in (0, 1, 17, 1000)]
    for tag, (dtype, count) in enumerate(cases):
        for arena in (True, False):
            what = (np.dtype(dtype).name, count, "arena" if arena else "private")
            send = make_buffer(comm, (p, count), dtype, arena)
            fill(send, seeded(comm, tag, send.nbytes))
            expected = reference_alltoall(comm, send)
            if not same_bits(zcoll.alltoall(comm, send, order=order), expected):
                failures.append(("alltoall", *what))
            buf = make_buffer(comm, (p, count), dtype, arena)
            buf[...] = send
            zcoll.alltoall(comm, zcoll.IN_PLACE, buf, order=order)
            if not same_bits(buf, expected):
                failures.append(("in-place alltoall", *what))
            expected = reference_allgather(comm, send[0])
            if not same_bits(zcoll.allgather(comm, send[0], order=order), expected):
                failures.append(("allgather", *what))
            fill(buf, random_bytes(tag, buf.nbytes))
            buf[comm.rank] = send[0]
            zcoll.allgather(comm, zcoll.IN_PLACE, buf, order=order)
            if not same_bits(buf, expected):
                failures.append(("in-place allgather", *what))
    send = zcoll.empty(comm, (p, 33), np.int64)
    with zcoll.alltoall_init(comm, send, order=order) as plan:  # a plan runs the same schedule
        for run in range(2):
            send[...] = np.arange(send.size).reshape(send.shape) + 1000 * comm.rank + run
            if not same_bits(plan(), reference_alltoall(comm, send)):
                failures.append(("alltoall_init", run))
    all_ranks_agree(comm, not failures, f"order={order} on {NUMA_TOPOLOGY}: {failures}")
    # The context saw the described NUMA nodes (node rank i on PU i: NUMA node i // 2).
    ctx = _context.context(comm)
    want = len({r // 2 % 4 for r in range(ctx.node_size)})
    all_ranks_agree(comm, ctx.core.numa_domains == want, f"{ctx.core.numa_domains} != {want}")


@pytest.mark.parametrize("order", ORDERS)
def test_large_blocks(world, order):
    send = zcoll.empty(world, (world.size, LARGE_COUNT), np.complex128)
    fill(send, seeded(world, 99, send.nbytes))
    ok = same_bits(zcoll.alltoall(world, send, order=order), reference_alltoall(world, send))
    gathered = zcoll.allgather(world, send[0], order=order)
    ok &= same_bits(gathered, reference_allgather(world, send[0]))
    all_ranks_agree(world, ok, f"large blocks, order={order}")


def encoded(src: int, dst: int, count: int) -> np.ndarray:
    """Closed form: element i of the block src -> dst is src * 10**9 + dst * 10**6 + i."""
    return src * 10**9 + dst * 10**6 + np.arange(count, dtype=np.int64)


GUARD = 257  # elements of guard on each side, filled with a pattern nobody writes


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("arena", [True, False], ids=["arena", "private"])
def test_closed_form_with_guard_bytes(comm, order, arena):
    with private_buffers_by(comm, "staged"):
        closed_form_with_guard_bytes(comm, order, arena)


def test_closed_form_with_guard_bytes_pulled_by_cma(comm):
    with private_buffers_by(comm, "cma"):
        closed_form_with_guard_bytes(comm, "auto", arena=False)


def closed_form_with_guard_bytes(comm, order, arena):
    p, me, count = comm.size, comm.rank, 13
    n = p * count
    guard = np.int64(-0x5A5A5A5A5A5A5A5B)
    big_send = make_buffer(comm, n + 2 * GUARD, np.int64, arena)
    big_recv = make_buffer(comm, n + 2 * GUARD, np.int64, arena)
    big_send[:] = guard
    big_recv[:] = guard
    send = big_send[GUARD:-GUARD].reshape(p, count)
    recv = big_recv[GUARD:-GUARD].reshape(p, count)
    for dst in range(p):
        send[dst] = encoded(me, dst, count)
    zcoll.alltoall(comm, send, recv, order=order)
    ok = all(np.array_equal(recv[src], encoded(src, me, count)) for src in range(p))
    gathered = zcoll.allgather(comm, send[0], big_recv[GUARD:-GUARD].reshape(p, count))
    ok &= all(np.array_equal(gathered[src], encoded(src, 0, count)) for src in range(p))
    for big in (big_send, big_recv):
        ok &= bool((big[:GUARD] == guard).all() and (big[-GUARD:] == guard).all())
    all_ranks_agree(comm, ok, f"closed form order={order} arena={arena}")


def test_one_dimensional_buffers(world):
    p = world.size
    send = np.arange(p * 5, dtype=np.float32) + 100 * world.rank
    got = zcoll.alltoall(world, send)
    ok = got.shape == send.shape and same_bits(got, reference_alltoall(world, send))
    flat = np.empty(p * 3, np.int16)
    zcoll.allgather(world, np.full(3, world.rank, np.int16), flat)
    ok &= np.array_equal(flat, np.repeat(np.arange(p, dtype=np.int16), 3))
    all_ranks_agree(world, ok, "1-D buffers")


def test_results_default_to_arena_arrays(world):
    send = np.ones((world.size, 2, 3), np.uint16)
    a = zcoll.alltoall(world, send)
    g = zcoll.allgather(world, send[0])
    ok = zcoll.is_shared(a) and zcoll.is_shared(g)
    ok &= a.shape == send.shape and g.shape == (world.size, 2, 3)
    ok &= not zcoll.is_shared(send)
    all_ranks_agree(world, ok, "recvbuf=None allocates in the arena")


def _counting(monkeypatch, module, name: str) -> list[int]:
    """Counts the calls of `module.name` (a Python path) in the returned one-element list."""
    count = [0]
    original = getattr(module, name)

    def counted(*args, **kwargs):
        count[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return count


@pytest.mark.parametrize("nbytes", [24, 96 * 1024])
def test_an_omitted_recvbuf_takes_the_path_of_a_given_one(comm, monkeypatch, nbytes):
    """A call without `recvbuf` allocates its result and then runs as the call given one: the
    same number of runs of the Python paths (none on one node, once the communicator is
    known), and MPI's bits. alltoall, allgather, allreduce, reduce, reduce_scatter_block;
    small blocks and blocks beyond the round between nodes."""
    from zcoll import _collectives, _reductions

    p, count = comm.size, nbytes // 8
    send = np.random.default_rng(comm.rank).integers(-99, 99, (p, count))
    gather = reference_allgather(comm, send[0])
    total = np.empty_like(send)
    comm.Allreduce(send, total, op=MPI.SUM)
    calls = {
        "alltoall": (lambda r: zcoll.alltoall(comm, send, r), reference_alltoall(comm, send)),
        "allgather": (lambda r: zcoll.allgather(comm, send[0], r), gather),
        "allreduce": (lambda r: zcoll.allreduce(comm, send, r), total),
        "reduce": (lambda r: zcoll.reduce(comm, send, r, root=p - 1), total),
        "reduce_scatter_block": (
            lambda r: zcoll.reduce_scatter_block(comm, send, r),
            total[comm.rank],
        ),
    }
    python_paths = (
        _counting(monkeypatch, _collectives, "_exchange"),
        _counting(monkeypatch, _reductions, "_reduction"),
    )
    failures = []
    for name, (call, want) in calls.items():
        call(np.empty_like(want))  # a first call may take the Python path, once
        runs = []
        for given in (True, False):
            before = sum(c[0] for c in python_paths)
            got = call(np.empty_like(want) if given else None)
            runs.append(sum(c[0] for c in python_paths) - before)
            if (got is not None or comm.rank == p - 1) and not same_bits(got, want):
                failures.append((name, "given" if given else "omitted", "wrong result"))
        if runs[0] != runs[1]:
            failures.append((name, "Python path runs given / omitted", runs))
    all_ranks_agree(comm, not failures, f"{failures}")


def test_non_contiguous_sendbuf_is_copied(world):
    p = world.size
    base = np.arange(p * 4 * 2, dtype=np.int32).reshape(p, 8) + 1000 * world.rank
    send = base[:, ::2]  # not contiguous
    got = zcoll.alltoall(world, send)
    all_ranks_agree(world, same_bits(got, reference_alltoall(world, np.ascontiguousarray(send))))


def test_several_communicators_at_once(world):
    """Contexts of WORLD, a dup and two splits alive together, calls interleaved, and arrays
    allocated on WORLD used on the sub-communicators (no staging needed there)."""
    dup = world.Dup()
    rev = world.Split(0, key=-world.rank)
    halves = world.Split(world.rank % 2, key=world.rank)
    try:
        ok = True
        for round_ in range(3):
            for c in (world, dup, rev, halves):
                send = zcoll.empty(world, (c.size, 7), np.float64)
                fill(send, seeded(c, round_, send.nbytes))
                recv = zcoll.empty(world, (c.size, 7), np.float64)
                zcoll.alltoall(c, send, recv, order="morton")
                ok &= same_bits(recv, reference_alltoall(c, send))
                ok &= same_bits(zcoll.allgather(c, send[0]), reference_allgather(c, send[0]))
        all_ranks_agree(world, ok, "interleaved communicators")
    finally:
        for c in (dup, rev, halves):
            c.Free()


def test_many_calls_same_buffers(world):
    send = zcoll.empty(world, (world.size, 3), np.int64)
    recv = zcoll.empty(world, (world.size, 3), np.int64)
    ok = True
    for i in range(200):
        send[:] = i * 1000 + world.rank * 10 + np.arange(world.size)[:, None]
        zcoll.alltoall(world, send, recv, order=zcoll.ORDERS[i % 4])
        ok &= bool((recv == i * 1000 + np.arange(world.size)[:, None] * 10 + world.rank).all())
    all_ranks_agree(world, ok, "repeated calls")


@pytest.mark.parametrize("op", ["alltoall", "allgather"])
def test_back_to_back_calls_with_jitter(world, op):
    """Ranks race ahead into the next call (the small-message path has no completion barrier):
    every result must still be exact. Rank-dependent pauses shuffle who is early."""
    p, me = world.size, world.rank
    rng = np.random.default_rng(1234 + me)
    ok = True
    for i in range(300):
        send = np.full((p, 3), i * 100 + me, np.int64) + np.arange(p)[:, None] * 10_000
        if op == "alltoall":
            got = zcoll.alltoall(world, send)
            expected = i * 100 + np.arange(p)[:, None] + me * 10_000
        else:
            got = zcoll.allgather(world, send[0])
            expected = i * 100 + np.arange(p)[:, None]
        ok &= bool((got == expected).all())
        if rng.random() < 0.05:
            time.sleep(rng.random() * 1e-3)
    all_ranks_agree(world, ok, f"back-to-back {op}")


COPY_COUNTS = [0, 1, 7, 100, 1000, 20_001]  # bytes per block up to ~160 KiB for 8-byte types


@contextlib.contextmanager
def hybrid_threshold(comm, nbytes: int | None):
    """`comm`'s context with its hybrid-copy threshold set to `nbytes` (None: unchanged) and,
    when set, "auto" allowed to stream calls that fit in cache; restored afterwards."""
    core = zcoll._context.context(comm).core
    old, cache = core.copy_threshold(0), core.copy_cache  # size class 0: the configured T
    if nbytes is not None:
        core.set_copy_threshold(nbytes)
        core.set_copy_cache(0)
    try:
        yield core
    finally:
        core.set_copy_threshold(old)
        core.set_copy_cache(cache)


@pytest.mark.parametrize("threshold", [None, 100], ids=["default", "100B"])
@pytest.mark.parametrize("copy", ["auto", *zcoll.COPY_MODES])
def test_copy_modes_match_mpi(comm, copy, threshold):
    """Every copy mode (streaming and hybrid stores, a threshold inside the blocks) moves the
    same bits as MPI, for alltoall and allgather, arena and private buffers."""
    p = comm.size
    failures = []
    cases = [(d, c, arena) for d in (np.uint8, np.float64) for c in COPY_COUNTS for arena in (1, 0)]
    with hybrid_threshold(comm, threshold):
        for tag, (dtype, count, arena) in enumerate(cases):
            send = make_buffer(comm, (p, count), dtype, arena=bool(arena))
            fill(send, seeded(comm, tag, send.nbytes))
            got = zcoll.alltoall(comm, send, copy=copy)
            if not same_bits(got, reference_alltoall(comm, send)):
                failures.append(("alltoall", np.dtype(dtype).name, count, arena))
            got = zcoll.allgather(comm, send[0], copy=copy)
            if not same_bits(got, reference_allgather(comm, send[0])):
                failures.append(("allgather", np.dtype(dtype).name, count, arena))
    all_ranks_agree(comm, not failures, f"copy={copy} threshold={threshold}: {failures}")


def test_auto_copy_tunes_without_changing_results(world):
    """Repeated calls of one size walk "auto" through its threshold halvings (a small start
    threshold makes them short) and then ordinary stores (T = the whole block); every call is
    still right."""
    block = 64 * 1024
    send = zcoll.empty(world, (world.size, block), np.uint8)
    seen, failures = set(), []
    with hybrid_threshold(world, 16 * 1024) as core:
        for call in range(25):
            fill(send, seeded(world, call, send.nbytes))
            seen.add(core.copy_threshold(block))
            got = zcoll.alltoall(world, send, order="row")
            if not same_bits(got, reference_alltoall(world, send)):
                failures.append(call)
    all_ranks_agree(world, not failures, f"auto copy, wrong results in calls {failures}")
    all_ranks_agree(world, len(seen) >= 2, f"the threshold never moved: {seen}")
    all_ranks_agree(world, block in seen, f"ordinary stores were never tried: {seen}")


def test_bad_copy_mode_raises_everywhere(comm):
    send = np.zeros((comm.size, 4))
    outcome = None
    try:
        zcoll.alltoall(comm, send, copy="fast" if comm.rank == 0 else "auto")
    except ValueError as exc:
        outcome = str(exc)
    all_ranks_agree(comm, outcome is not None and "copy must be" in outcome, str(outcome))
    ok = same_bits(zcoll.alltoall(comm, send), send)  # the communicator still works
    all_ranks_agree(comm, ok, "alltoall after a bad copy mode")


def test_auto_copy_stays_temporal_only_while_the_call_fits_half_the_llc(world):
    """copy="auto": a call whose node footprint (send + receive of every node rank) is at most
    half the LLC stays temporal, untimed; one that fills more of it is refined at run time,
    ordinary stores first (copy_threshold says T = the whole block while they are timed). On
    COMM_SELF, where each rank's call is its node's whole footprint."""
    block = 64 * 1024
    send = zcoll.empty(MPI.COMM_SELF, (1, block), np.uint8)
    footprint = 2 * block
    seen: list = []
    with hybrid_threshold(MPI.COMM_SELF, 16 * 1024) as core:
        for cache in (2 * footprint, 2 * footprint - 64):  # filled: half, a little more
            core.set_copy_cache(cache)
            seen.append(core.auto_copy_plan(block, block)[0])
            zcoll.alltoall(MPI.COMM_SELF, send, order="row")
            seen.append(core.copy_threshold(block))
    want = ["temporal", 16 * 1024, "temporal", block]
    all_ranks_agree(world, seen == want, f"{seen} != {want}")


def _python_path_reached(*args, **kwargs):
    raise AssertionError("the Python path ran")


def test_without_recvbuf_the_same_one_crossing(world, monkeypatch):
    """alltoall, allgather, allgatherv and the neighbourhood gathers called without recvbuf on
    communicators zcoll has used take the one crossing into the engine that calls with recvbuf
    take (the Python paths raise here), on one node and across virtual and emulated nodes; the
    results against MPI (neighbourhood calls: or point-to-point, vcoll_reference)."""
    p, me = world.size, world.rank
    comm = world.Dup()
    cart = world.Create_cart([p], periods=[True])
    try:
        send = np.arange(p * 300, dtype=np.float64).reshape(p, 300) + 1e4 * me
        mine = np.full(200 + 7 * me, me, np.int32)
        sizes = [200 + 7 * j for j in range(p)]
        indeg = ref.degrees(cart)[0]
        block = np.arange(50, dtype=np.int64) + 100 * me
        # Each communicator's first calls (they make its context), with recvbuf.
        zcoll.alltoall(comm, send, np.empty_like(send))
        zcoll.allgather(comm, send[0], np.empty_like(send))
        zcoll.allgatherv(comm, mine, [np.empty(sum(sizes), np.int32), sizes])
        zcoll.neighbor_alltoall(
            cart, np.zeros((indeg, 50), np.int64), np.empty((indeg, 50), np.int64)
        )
        zcoll.neighbor_allgather(cart, block, np.empty((indeg, 50), np.int64))
        monkeypatch.setattr(_collectives, "_exchange", _python_path_reached)
        monkeypatch.setattr(_vcollectives, "_python_path", _python_path_reached)
        failures = []
        want = np.empty_like(send)
        comm.Alltoall(send, want)
        if not np.array_equal(zcoll.alltoall(comm, send), want):
            failures.append("alltoall")
        comm.Allgather(send[0], want)
        if not np.array_equal(zcoll.allgather(comm, send[0]).reshape(want.shape), want):
            failures.append("allgather")
        gathered = np.empty(sum(sizes), np.int32)
        comm.Allgatherv(mine, [gathered, sizes])
        if not np.array_equal(zcoll.allgatherv(comm, mine), gathered):
            failures.append("allgatherv")
        blocks = np.repeat(block[None], indeg, axis=0) + np.arange(indeg)[:, None]
        expected = np.empty((indeg, 50), np.int64)
        ref.neighbor_reference("alltoall")(cart, blocks, expected, 50)
        if not np.array_equal(zcoll.neighbor_alltoall(cart, blocks), expected):
            failures.append("neighbor_alltoall")
        ref.neighbor_reference("allgather")(cart, block, expected)
        if not np.array_equal(zcoll.neighbor_allgather(cart, block), expected):
            failures.append("neighbor_allgather")
    finally:
        monkeypatch.undo()
        cart.Free()
        comm.Free()
    all_ranks_agree(world, not failures, f"without recvbuf: {failures}")
