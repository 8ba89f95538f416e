"""Persistent plans: bit for bit against mpi4py and the plain call, over runs with new data;
start/wait/test interleaved with other calls; many live plans; freeing; misuse."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from mpi4py import MPI

import zcoll
from helpers import DTYPES, PRIVATE_PATHS, all_ranks_agree, dtypes_for, private_buffers_by
from helpers.collectives import (
    fill,
    make_buffer,
    reference_allgather,
    reference_alltoall,
    same_bits,
    seeded,
)
from helpers.errors import expect_everywhere, last
from zcoll import _context
from zcoll._context import lookup

# "numa" without a NUMA topology is Morton's schedule; test_collectives.test_numa_matches_mpi
# runs it (plans too) on a described NUMA machine.
ORDERS = ["auto", *(o for o in zcoll.ORDERS if o != "numa")]
COUNTS = [0, 1, 3, 17, 1000]
RUNS = 3  # runs of each plan, each with new data


def _buffers(comm, op: str, dtype, count: int, mode: str):
    if op == "alltoall":
        send = make_buffer(comm, (comm.size, count), dtype, arena=mode == "arena")
    else:
        send = make_buffer(comm, (count,), dtype, arena=mode == "arena")
    recv = make_buffer(comm, (comm.size, count), dtype, arena=mode != "private")
    return send, recv


def _reference(comm, op: str, send: np.ndarray) -> np.ndarray:
    return reference_alltoall(comm, send) if op == "alltoall" else reference_allgather(comm, send)


def _init(op: str):
    return zcoll.alltoall_init if op == "alltoall" else zcoll.allgather_init


@pytest.mark.parametrize("op", ["alltoall", "allgather"])
@pytest.mark.parametrize("mode", ["arena", "private", "mixed"])
@pytest.mark.parametrize("order", ORDERS)
def test_plan_matches_mpi_and_the_plain_call(comm, order, mode, op):
    failures = []
    for tag, (dtype, count) in enumerate((d, c) for d in dtypes_for(comm) for c in COUNTS):
        send, recv = _buffers(comm, op, dtype, count, mode)
        plain = np.empty_like(recv)
        with _init(op)(comm, send, recv, order=order) as plan:
            for run in range(RUNS):
                fill(send, seeded(comm, tag * RUNS + run, send.nbytes))
                expected = _reference(comm, op, send)
                got = plan()
                getattr(zcoll, op)(comm, send, plain, order=order)
                if got is not recv or not same_bits(got, expected) or not same_bits(plain, got):
                    failures.append((np.dtype(dtype).name, count, run))
    all_ranks_agree(comm, not failures, f"{op}_init order={order} mode={mode}: {failures}")


@pytest.mark.parametrize("op", ["alltoall", "allgather"])
@pytest.mark.parametrize("mode", ["private", "mixed"])
@pytest.mark.parametrize("path", PRIVATE_PATHS)
def test_plans_on_private_buffers(comm, path, mode, op):
    """Plans on plain NumPy buffers, pulled by CMA each run or shadowed in the arena, whatever
    their size: every dtype (dtypes_for) and count, against MPI and the plain call, over runs."""
    failures = []
    with private_buffers_by(comm, path):
        for tag, (dtype, count) in enumerate((d, c) for d in dtypes_for(comm) for c in COUNTS):
            send, recv = _buffers(comm, op, dtype, count, mode)
            with _init(op)(comm, send, recv) as plan:
                for run in range(RUNS):
                    fill(send, seeded(comm, tag * RUNS + run, send.nbytes))
                    got = plan()
                    if got is not recv or not same_bits(got, _reference(comm, op, send)):
                        failures.append((np.dtype(dtype).name, count, run))
    all_ranks_agree(comm, not failures, f"{op}_init {path} {mode}: {failures}")


@pytest.mark.parametrize("mode", ["arena", "private"])
@pytest.mark.parametrize("order", ORDERS)
def test_in_place_plans_match_mpi(comm, order, mode):
    failures = []
    for tag, count in enumerate(COUNTS):
        dtype = DTYPES[tag * 3 % len(DTYPES)]
        a2a = make_buffer(comm, (comm.size, count), dtype, arena=mode == "arena")
        ag = make_buffer(comm, (comm.size, count), dtype, arena=mode == "arena")
        with (
            zcoll.alltoall_init(comm, zcoll.IN_PLACE, a2a, order=order) as p1,
            zcoll.allgather_init(comm, zcoll.IN_PLACE, ag, order=order) as p2,
        ):
            for run in range(RUNS):
                fill(a2a, seeded(comm, 10 * tag + run, a2a.nbytes))
                expected = reference_alltoall(comm, a2a)
                p1()
                if not same_bits(a2a, expected):
                    failures.append(("alltoall", count, run))
                fill(ag, seeded(comm, 20 * tag + run, ag.nbytes))
                mine = ag[comm.rank].copy()
                expected = reference_allgather(comm, mine)
                p2()
                if not same_bits(ag, expected):
                    failures.append(("allgather", count, run))
    all_ranks_agree(comm, not failures, f"in-place plans order={order} mode={mode}: {failures}")


@pytest.mark.parametrize("copy", ["auto", *zcoll.COPY_MODES])
def test_copy_modes(comm, copy):
    count = 70_001  # ~0.5 MiB blocks: past the hybrid threshold
    send = zcoll.empty(comm, (comm.size, count), np.float64)
    recv = zcoll.empty(comm, (comm.size, count), np.float64)
    ok = True
    with zcoll.alltoall_init(comm, send, recv, copy=copy) as plan:
        ok = plan.copy in zcoll.COPY_MODES and (copy == "auto" or plan.copy == copy)
        for run in range(4):  # auto may try several thresholds on its first runs
            fill(send, seeded(comm, run, send.nbytes))
            ok = ok and same_bits(plan(), reference_alltoall(comm, send))
    all_ranks_agree(comm, ok, f"copy={copy}")


def test_attributes(world):
    send = zcoll.empty(world, (world.size, 2), np.int32)
    plan = zcoll.alltoall_init(world, send, order="morton")
    ok = (
        plan.op == "alltoall"
        and plan.order == "morton"
        and plan.sendbuf is send
        and zcoll.is_shared(plan.recvbuf)
        and plan.recvbuf.shape == send.shape
        and not plan.active
        and not plan.freed
        and "alltoall" in repr(plan)
    )
    small = zcoll.allgather_init(world, np.zeros(1))
    ok = ok and small.order == "eager" and small.copy == "temporal"
    plan.free()
    small.free()
    ok = ok and plan.freed and plan.recvbuf is None and "freed" in repr(plan)
    all_ranks_agree(world, ok, "plan attributes")


@pytest.mark.parametrize("order", ["auto", "row"])  # auto at 8 B: the eager path
def test_start_wait_interleaved_with_other_calls(comm, order, world):
    other = world.Dup()
    p = comm.size
    a = zcoll.empty(comm, (p, 1), np.int64)
    b = zcoll.empty(comm, (p, 3), np.float32)
    ra = zcoll.empty(comm, (p, 1), np.int64)
    rb = zcoll.empty(comm, (p, 3), np.float32)
    ok = True
    with (
        zcoll.alltoall_init(comm, a, ra, order=order) as pa,
        zcoll.alltoall_init(comm, b, rb, order=order) as pb,
    ):
        for run in range(5):
            fill(a, seeded(comm, run, a.nbytes))
            fill(b, seeded(comm, 100 + run, b.nbytes))
            ea, eb = reference_alltoall(comm, a), reference_alltoall(comm, b)
            pa.start()
            ok = ok and pa.active
            # Other collectives while pa is active: on another communicator, then on this one
            # (which finishes pa first), then a second plan on this one.
            x = zcoll.allgather(other, np.full(2, world.rank, np.int16))
            ok = ok and bool((x == np.arange(world.size)[:, None]).all())
            y = zcoll.alltoall(comm, np.full((p, 1), comm.rank, np.int32))
            ok = ok and bool((y[:, 0] == np.arange(p)).all())
            pb.start()
            if run % 2:
                while not pb.test():
                    pass
            else:
                pb.wait()
            pa.wait()  # already finished by the calls above: returns at once
            ok = ok and not pa.active and not pb.active
            ok = ok and same_bits(ra, ea) and same_bits(rb, eb)
    other.Free()
    all_ranks_agree(comm, ok, f"interleaved plans order={order}")


def test_many_live_plans(world):
    p = world.size
    rng = np.random.default_rng(7)  # same sequence on every rank
    plans, expected = [], []
    for k in range(24):
        count = [0, 1, 5, 300, 4096][k % 5]
        send = make_buffer(world, (p, count), np.float64, arena=k % 3 != 0)
        fill(send, seeded(world, k, send.nbytes))
        plans.append(zcoll.alltoall_init(world, send, order=ORDERS[k % len(ORDERS)]))
        expected.append(reference_alltoall(world, send))
    ok = True
    for k in rng.permutation(len(plans)):
        ok = ok and same_bits(plans[k](), expected[k])
    for k in rng.permutation(len(plans)):
        plans[k].start()  # each start finishes the one before
    for k in range(len(plans)):
        plans[k].wait()
        ok = ok and same_bits(plans[k].recvbuf, expected[k])
    for plan in plans:
        plan.free()
    all_ranks_agree(world, ok, "24 live plans")


def test_free_in_any_order_on_different_ranks(world):
    plans = [zcoll.allgather_init(world, np.full(n, world.rank, np.int32)) for n in (1, 50, 5000)]
    for plan in plans:
        plan()
    order = [2, 0, 1] if world.rank % 2 else [1, 2, 0]
    for k in order:
        plans[k].free()
    plans[order[0]].free()  # freeing twice is harmless
    again = zcoll.allgather_init(world, np.full(7, world.rank, np.int32))
    got = again()
    again.free()
    all_ranks_agree(world, bool((got == np.arange(world.size)[:, None]).all()), "after frees")


@pytest.mark.parametrize("path", PRIVATE_PATHS)
def test_plan_holds_its_buffers(world, path):
    def make():
        send = np.full((world.size, 1000), world.rank, np.int64)  # private: pulled or shadowed
        with private_buffers_by(world, path):
            return zcoll.alltoall_init(world, send), send.ctypes.data

    plan, _ = make()
    gc.collect()
    junk = [np.full(1000 * world.size, -1, np.int64) for _ in range(10)]  # reuse freed memory
    ok = all(bool((plan()[:, 0] == np.arange(world.size)).all()) for _ in range(3))
    del junk
    plan.free()
    all_ranks_agree(world, ok, "plan after the caller dropped its arrays")


def test_misuse_after_free_and_while_active(world):
    plan = zcoll.alltoall_init(world, np.zeros((world.size, 1)))
    plan.start()
    with pytest.raises(ValueError, match="already active"):
        plan.start()
    plan.wait()
    plan.wait()  # waiting for an inactive plan returns at once
    assert plan.test()
    plan.free()
    for use in (plan, plan.start, plan.wait, plan.test):
        with pytest.raises(ValueError, match="freed"):
            use()
    assert "freed" in repr(plan)


def test_plan_after_its_communicator_was_freed(world):
    dup = world.Dup()
    plan = zcoll.alltoall_init(dup, np.zeros((dup.size, 1)))
    plan()
    dup.Free()
    with pytest.raises((ValueError, zcoll.PeerError), match="closed|freed"):
        plan()
    plan.free()


def test_bad_arguments_raise_on_every_rank(world):
    p = world.size
    if p > 1:  # block sizes differ between ranks
        n = 3 if last(world) else 2
        expect_everywhere(
            world,
            lambda: zcoll.alltoall_init(world, np.zeros((p, n))),
            ValueError,
            fragment="block",
        )
    # A non-contiguous sendbuf: a plan would not see later writes to the original.
    send = np.zeros((p, 4))[:, ::2] if last(world) else np.zeros((p, 2))
    expect_everywhere(
        world, lambda: zcoll.alltoall_init(world, send), TypeError, fragment="C-contiguous"
    )
    bad_order = "zigzag" if last(world) else "row"
    expect_everywhere(
        world,
        lambda: zcoll.alltoall_init(world, np.zeros((p, 1)), order=bad_order),
        ValueError,
        fragment="order",
    )
    recv = np.zeros((p, 1), np.float32) if last(world) else np.zeros((p, 1))
    expect_everywhere(
        world, lambda: zcoll.alltoall_init(world, np.zeros((p, 1)), recv), TypeError, fragment=""
    )


def test_different_plans_at_once_raise_everywhere(world):
    if world.size == 1:
        pytest.skip("needs two ranks to disagree")
    if lookup(world).multi_node:
        pytest.skip("across nodes a mismatch is a PeerError after the timeout (see Plan's notes)")
    p = world.size
    a = zcoll.alltoall_init(world, np.zeros((p, 1)))
    b = zcoll.alltoall_init(world, np.zeros((p, 100_000)))  # the ordered path
    for first, second in ((a, b), (b, a)):
        expect_everywhere(
            world,
            lambda first=first, second=second: (second if last(world) else first)(),
            ValueError,
            fragment="different persistent plans",
        )
    # A plan against a plain call.
    expect_everywhere(
        world,
        lambda: zcoll.alltoall(world, np.zeros((p, 1))) if last(world) else a(),
        ValueError,
        fragment="different operations",
    )
    ok = bool((a() == 0).all()) and bool((b() == 0).all())
    a.free()
    b.free()
    all_ranks_agree(world, ok, "plans still run after the errors")


def test_plan_on_comm_self_and_split(world):
    split = world.Split(world.rank % 2, key=world.size - world.rank)
    ok = True
    for comm in (MPI.COMM_SELF, split):
        send = np.arange(comm.size * 3, dtype=np.int16).reshape(comm.size, 3) + 100 * comm.rank
        with zcoll.alltoall_init(comm, send) as plan:
            ok = ok and same_bits(plan(), reference_alltoall(comm, send))
    split.Free()
    all_ranks_agree(world, ok, "plans on COMM_SELF and a split")


@pytest.mark.parametrize("kind", ["Plan", "VPlan", "TransferPlan"])
def test_repr_of_a_plan_whose_construction_raised(kind):
    """An instance whose construction raised is still reachable (pytest prints `self` of the
    failing __init__): its repr says so instead of reading a plan that was never made."""
    import zcoll._plans as plans
    import zcoll._vcollectives as vcollectives
    import zcoll.fft.pencil as pencil

    cls = {"Plan": plans.Plan, "VPlan": vcollectives.VPlan,
           "TransferPlan": pencil.TransferPlan}[kind]  # fmt: skip
    assert repr(cls.__new__(cls)) == f"<{cls._kind} (not made)>"


def test_explain_says_what_the_plan_decided(world):
    """plan.explain() on the four paths: eager (small), ordered on arena buffers, pulled by
    CMA and shadowed in the arena (plain buffers forced each way), in place; and whether blocks
    cross nodes."""
    ctx = _context.context(world)
    p, multi = world.size, ctx.multi_node
    small = np.zeros((p, 1), np.int8)
    big = zcoll.zeros(world, (p, 1 << 16), np.uint8)
    cases = []
    with zcoll.alltoall_init(world, small, np.empty_like(small)) as plan:
        cases.append(("eager", plan.explain(), "eager", "private", "private"))
    with zcoll.alltoall_init(world, big, zcoll.zeros(world, big.shape, np.uint8)) as plan:
        cases.append(("arena", plan.explain(), "ordered", "shared", "shared"))
    shadowed = ("ordered", "shadowed", "shadowed")
    # A rank alone on its node has no peer to pull from: its plain buffers are shadowed.
    pulled = ("pulled", "pulled", "private") if ctx.node_size > 1 else shadowed
    for path, want in (("cma", pulled), ("staged", shadowed)):
        with private_buffers_by(world, path):
            plain = np.ones((p, 1 << 16), np.uint8)
            with zcoll.alltoall_init(world, plain, np.empty_like(plain)) as plan:
                cases.append((path, plan.explain(), *want))
    with zcoll.allgather_init(world, zcoll.IN_PLACE, big) as plan:
        cases.append(("in place", plan.explain(), "ordered", "in place", "shared"))
    failures = []
    for name, told, path, send, recv in cases:
        if (told["path"], told["sendbuf"], told["recvbuf"]) != (path, send, recv):
            failures.append((name, told))
        if not told["why"] or told["op"] not in ("alltoall", "allgather"):
            failures.append((name, "no reason or op", told))
        if (told["between_nodes"] is not None) != multi:
            failures.append((name, "between nodes", told))
    all_ranks_agree(world, not failures, f"{failures}")


def test_vplan_explain_says_what_the_plan_decided(world):
    """VPlan.explain(): shared, shadowed and in-place buffers named as they are; the ordered
    path; on one node, the ranks' copied bytes add up to every byte the node receives."""
    ctx = _context.context(world)
    p = world.size
    counts = np.arange(1, p + 1, dtype=np.int64) * 3  # rank j receives 3(j+1) bytes from each
    recv_counts = np.full(p, counts[world.rank], np.int64)
    cases = []
    arena_send = zcoll.zeros(world, int(counts.sum()), np.uint8)
    arena_recv = zcoll.zeros(world, int(recv_counts.sum()), np.uint8)
    with zcoll.alltoallv_init(world, [arena_send, counts], [arena_recv, recv_counts]) as plan:
        cases.append(("arena", plan.explain(), "shared", "shared"))
    plain_send, plain_recv = np.ones(int(counts.sum()), np.uint8), np.empty_like(arena_recv)
    with zcoll.alltoallv_init(world, [plain_send, counts], [plain_recv, recv_counts]) as plan:
        cases.append(("plain", plan.explain(), "shadowed", "shadowed"))
    square = zcoll.zeros(world, 4 * p, np.int32)
    with zcoll.alltoallv_init(world, zcoll.IN_PLACE, square) as plan:
        cases.append(("in place", plan.explain(), "in place", "shared"))
    failures = [
        (name, told)
        for name, told, send, recv in cases
        if (told["op"], told["path"], told["sendbuf"], told["recvbuf"])
        != ("alltoallv", "ordered", send, recv)
        or not told["why"]
        or (told["between_nodes"] is not None) != ctx.multi_node
    ]
    if not ctx.multi_node:
        copied = world.allreduce(cases[0][1]["copied_bytes"])
        if copied != int(counts.sum()) * p:
            failures.append(("copied bytes", copied, int(counts.sum()) * p))
    all_ranks_agree(world, not failures, f"{failures}")
