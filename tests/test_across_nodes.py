"""alltoall across nodes (TPDS'18 §2.5): the aggregated path (one message per node pair) and
the direct one (rank to rank), on virtual nodes of 1, 2 and 3 ranks at P = 4, 5, 6 and 8 --
uneven nodes included -- bit for bit against mpi4py's Alltoall; allgather, the small
reductions and the irregular collectives, whose blocks travel in the same round; calls that
differ between nodes; a rank killed in the middle of the exchange between nodes.

Each layout's checks against mpi4py run as one mpiexec job (ZCOLL_VIRTUAL_NODE_SIZE is read
when a context is made), each part reported under its own test, launched from the P = 1 run;
the suite's own virtual-node runs (P = 4, 5 with nodes of 2) run the rest of the suite on the
same path.
"""

from __future__ import annotations

import re
import sys
import textwrap

import pytest
from run_mpi import emulated_cluster

from helpers.jobs import (
    alone,
    is_open_mpi,
    job_env,
    job_ranks_ended,
    leaked_entries,
    mpiexec,
    read_job_pids,
    run_job,
    zcoll_shm_entries,
)
from zcoll import _aggregated

# The jobs that check results against mpi4py: each rank collects what differs in `bad`; rank 0
# prints OK or the first differences.
_JOB_HEAD = """
import numpy as np
from mpi4py import MPI
import zcoll
from zcoll import _aggregated

world = MPI.COMM_WORLD
comms = {"world": world, "dup": world.Dup(), "reversed": world.Split(0, key=-world.rank)}
bad = []


def check(what, got, expect):
    if got.tobytes() != expect.tobytes():
        bad.append(what)


def placed(comm, send, recv_shape, where):
    # The call's buffers, the send buffer holding `send`: "private" NumPy arrays, "arena" ones
    # (collective), or "mixed" (arena on even ranks, private on odd ones).
    if where != "private":
        s = zcoll.empty(comm, send.shape, send.dtype)
        r = zcoll.empty(comm, recv_shape, send.dtype)
        s[...] = send
    if where == "private" or (where == "mixed" and comm.rank % 2):
        s, r = send.copy(), np.empty(recv_shape, send.dtype)
    return s, r


def cases(seed, dtypes, few):
    # The size rule, every block in the round, none in it; each communicator, every dtype on
    # WORLD and `few` on the others.
    for forced in (None, True, False):
        for name, comm in comms.items():
            _aggregated.force(comm, forced)
            rng = np.random.default_rng(seed + comm.rank)
            for dt in dtypes if name == "world" else few:
                yield forced, name, comm, rng, dt
    for comm in comms.values():
        _aggregated.force(comm, None)
"""
_JOB_TAIL = """
everyone = world.gather(bad, root=0)
if world.rank == 0:
    failed = [b for rank_bad in everyone for b in rank_bad]
    print("<<RESULT", "OK" if not failed else failed[:5], ">>", flush=True)
"""


def _checking_job(body: str) -> str:
    return _JOB_HEAD + textwrap.dedent(body) + _JOB_TAIL


CHECK_JOB = _checking_job(
    """
    dtypes = ["i1", "u2", "i4", "i8", "u8", "f2", "f4", "f8", "c8", "c16", "?"]
    # The two ways of packing forced too (aggregate.hpp's sender_packs_bytes: each message by
    # its sender alone, or by the node in shares), on fewer communicators and dtypes.
    core = zcoll._context.context(world).core
    paths = [(True, "aggregated", None), (False, "direct", None)]
    paths += [(True, "in shares", 0), (True, "alone", 2**64 - 1)]
    for aggregate, path, packs in paths:
        if packs is not None:
            core.set_sender_packs_bytes(packs)
        for name, comm in comms.items():
            _aggregated.force(comm, aggregate)
            if packs is not None and name != "world":
                continue
            p = comm.size
            rng = np.random.default_rng(7 + comm.rank)
            for dt in dtypes if packs is None else ("i1", "f8", "c16"):
                # Large odd blocks too: f8's messages exceed 64 KiB, packed in shares.
                for count in (0, 1, 3, 17) + ((4099,) if dt in ("i1", "f8", "c16") else ()):
                    data = rng.integers(0, 256, (p, count * np.dtype(dt).itemsize), np.uint8)
                    send = np.ascontiguousarray(data).view(dt)
                    expect = np.empty_like(data)
                    comm.Alltoall(data, expect)  # as bytes: MPI has no float16
                    for where in ("private", "arena", "mixed"):
                        s, r = placed(comm, send, send.shape, where)
                        r.view(np.uint8)[...] = 0xA5
                        zcoll.alltoall(comm, s, r)
                        check((path, name, dt, count, where), r, expect)
                        r[...] = send
                        zcoll.alltoall(comm, zcoll.IN_PLACE, r)
                        check((path, name, dt, count, where, "in place"), r, expect)
                    out = zcoll.alltoall(comm, send)  # recvbuf=None: a new arena array
                    check((path, name, dt, count, "new recvbuf"), out, expect)
    """
)

AG_CHECK_JOB = _checking_job(
    """
    dtypes = ["i1", "u2", "i4", "i8", "u8", "f2", "f4", "f8", "c8", "c16", "?"]
    # An allgather's size rule (four times an alltoall's): blocks at and just past it.
    limit = _aggregated.pack_limit(zcoll._context.context(world), "allgather")
    for forced, name, comm, rng, dt in cases(3, dtypes, ("i1", "c16")):
        p, r = comm.size, comm.rank
        itemsize = np.dtype(dt).itemsize
        edge = (limit // itemsize, limit // itemsize + 1) if dt in ("i1", "f8") else ()
        for count in (0, 1, 3, 17, *edge):
            data = rng.integers(0, 256, count * itemsize, np.uint8)
            send = data.view(dt)
            expect = np.empty((p, data.size), np.uint8)
            comm.Allgather(data, expect)  # as bytes: MPI has no float16
            for where in ("private", "arena", "mixed"):
                s, g = placed(comm, send, (p, *send.shape), where)
                g.view(np.uint8)[...] = 0xA5
                zcoll.allgather(comm, s, g)
                check((forced, name, dt, count, where), g, expect)
                g.view(np.uint8)[...] = 0xA5
                g[r] = send
                zcoll.allgather(comm, zcoll.IN_PLACE, g)
                check((forced, name, dt, count, where, "in place"), g, expect)
            out = zcoll.allgather(comm, send)  # recvbuf=None: a new arena array
            check((forced, name, dt, count, "new recvbuf"), out, expect)
    """
)

RED_CHECK_JOB = _checking_job(
    """
    ctx = zcoll._context.context(world)
    # Small integer values: every order of summation gives the same bits, as MPI's would.
    dtypes = ["i1", "u2", "i4", "i8", "u8", "f4", "f8", "c8", "c16"]
    ops = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "bor": MPI.BOR}
    limit = _aggregated.pack_limit(ctx, "allreduce")  # the size rule's

    for forced, name, comm, rng, dt in cases(13, dtypes, ("i4", "f8")):
        p, r = comm.size, comm.rank
        itemsize = np.dtype(dt).itemsize
        counts = [1, 17, 3 * p]
        if dt in ("i1", "f8"):  # at and just past the limit
            edge = limit // itemsize // p * p
            counts += [edge, edge + p]
        for count in counts:
            x = rng.integers(0, 4, count).astype(dt)
            for opname, mpi_op in ops.items():
                if opname == "bor" and dt[0] not in "iu":
                    continue
                if opname in ("max", "min") and dt[0] == "c":
                    continue
                what = (forced, name, dt, count, opname)
                expect = np.empty_like(x)
                comm.Allreduce(x, expect, op=mpi_op)
                check(what + ("allreduce",), zcoll.allreduce(comm, x, op=opname), expect)
                y = x.copy()
                zcoll.allreduce(comm, zcoll.IN_PLACE, y, op=opname)
                check(what + ("allreduce in place",), y, expect)
                root = (count + 1) % p
                got = zcoll.reduce(comm, x, op=opname, root=root)
                if r == root:
                    check(what + ("reduce",), got, expect)
                if count % p == 0:
                    block = count // p
                    check(what + ("reduce_scatter_block",),
                          zcoll.reduce_scatter_block(comm, x, op=opname),
                          expect[r * block : (r + 1) * block])  # fmt: skip
            # bcast from a root on each node in turn (its node's messages carry it)
            for root in sorted({0, p // 2, p - 1}):
                expect = x.copy()
                comm.Bcast(expect, root=root)
                b = x.copy() if r == root else np.zeros_like(x)
                zcoll.bcast(comm, b, root=root)
                check((forced, name, dt, count, "bcast", root), b, expect)
    # Past the limit with the messages cut into short segments (17 lines: a ring that wraps,
    # a short last one), on each communicator, in place and not, roots on every node.
    for name, comm in comms.items():
        _aggregated.spread_segment(comm, 17 * 64)
        p, r = comm.size, comm.rank
        rng = np.random.default_rng(29 + r)
        for dt in ("i1", "f8"):
            count = (2 * limit // np.dtype(dt).itemsize // p + 5) * p
            x = rng.integers(0, 4, count).astype(dt)
            what = ("segments", name, dt, count)
            expect = np.empty_like(x)
            comm.Allreduce(x, expect)
            check(what + ("allreduce",), zcoll.allreduce(comm, x), expect)
            y = x.copy()
            zcoll.allreduce(comm, zcoll.IN_PLACE, y)
            check(what + ("allreduce in place",), y, expect)
            # Receive buffers in the arena (pieces land there, peers copy from them): on every
            # rank and on the even ranks only, in place and not; new values each time, so that
            # nothing left by an earlier call can pass.
            for kind in ("arena", "mixed", "mixed", "arena"):
                v = rng.integers(0, 4, count).astype(dt)
                want = np.empty_like(v)
                comm.Allreduce(v, want)
                a = zcoll.empty(comm, v.shape, v.dtype)
                if kind == "mixed" and r % 2:
                    a = np.empty_like(v)
                a[...] = 0
                zcoll.allreduce(comm, v, a)
                check(what + ("allreduce into", kind), a, want)
                a[...] = v
                zcoll.allreduce(comm, zcoll.IN_PLACE, a)
                check(what + ("allreduce in place", kind), a, want)
            for root in sorted({0, p // 2, p - 1}):
                got = zcoll.reduce(comm, x, root=root)
                y = x.copy()
                if r == root:
                    zcoll.reduce(comm, zcoll.IN_PLACE, y, root=root)
                else:
                    zcoll.reduce(comm, y, root=root)
                if r == root:
                    check(what + ("reduce", root), got, expect)
                    check(what + ("reduce in place", root), y, expect)
                # bcast: private and arena buffers (the root's read in place on its node)
                want = x.copy()
                comm.Bcast(want, root=root)
                for arena in (True, False):  # arena first: the result areas hold other data
                    b = zcoll.empty(comm, x.shape, x.dtype) if arena else np.empty_like(x)
                    b[...] = x if r == root else 0
                    zcoll.bcast(comm, b, root=root)
                    check(what + ("bcast", root, "arena" if arena else "private"), b, want)
            block = count // p
            mine = expect[r * block : (r + 1) * block]  # fmt: skip
            check(what + ("reduce_scatter_block",), zcoll.reduce_scatter_block(comm, x), mine)
            y = x.copy()
            zcoll.reduce_scatter_block(comm, zcoll.IN_PLACE, y)
            check(what + ("reduce_scatter_block in place",), y[:block], mine)
    for comm in comms.values():
        _aggregated.spread_segment(comm, None)
    # A size that differs on the last rank (small, and straddling the limit): every rank
    # raises ValueError, no result written, the communicator works afterwards.
    p, r = world.size, world.rank
    errors = []
    for n in (3, limit // 8 + 8):
        n = n if r == p - 1 else 2
        out = np.full(n, 7.0)
        try:
            zcoll.allreduce(world, np.ones(n), out)
            errors.append("no error")
        except ValueError:
            errors.append(bool((out == 7.0).all()))
    errors.append(bool((zcoll.allreduce(world, np.ones(3)) == p).all()))
    if errors != [True, True, True]:
        bad.append(("errors", errors))
    """
)

ERROR_JOB = textwrap.dedent(
    """
    import numpy as np
    from mpi4py import MPI
    import zcoll
    from zcoll import _aggregated

    world = MPI.COMM_WORLD
    p, rank = world.size, world.rank
    last = p - 1  # on the last node
    results = []

    def attempt(what, send, recv, **kw):
        recv_before = recv.copy()
        try:
            zcoll.alltoall(world, send, recv, **kw)
            results.append((what, "ok", True))
        except (ValueError, TypeError) as exc:
            results.append((what, type(exc).__name__, np.array_equal(recv, recv_before)))

    small = np.ones((p, 2), np.int64) * rank
    # Block sizes that differ between nodes, on both sides of the aggregation limit.
    big = _aggregated.pack_limit(zcoll._context.context(world)) // 8 + 8
    n = big if rank == last else 2
    attempt("size straddles the limit", np.ones((p, n), np.int64), np.zeros((p, n), np.int64))
    n = 3 if rank == last else 2
    attempt("size differs", np.ones((p, n), np.int64), np.zeros((p, n), np.int64))
    # an allgather whose block straddles its own limit, and one whose size differs
    big = _aggregated.pack_limit(zcoll._context.context(world), "allgather") // 8 + 8
    for n in (big, 3):
        n = n if rank == last else 2
        recv = np.zeros((p, n), np.int64)
        before = recv.copy()
        try:
            zcoll.allgather(world, np.ones(n, np.int64), recv)
            results.append(("allgather", "ok", True))
        except ValueError as exc:
            results.append(("allgather", type(exc).__name__, np.array_equal(recv, before)))
    # dtype differs on one rank
    dt = np.float64 if rank == last else np.int64
    attempt("dtype differs", np.ones((p, 2), dt), np.zeros((p, 2), dt))
    # a read-only receive buffer on one rank
    recv = np.zeros((p, 2), np.int64)
    recv.flags.writeable = rank != last
    attempt("read-only recvbuf", small, recv)
    # an unknown order on one rank
    order = "zigzag" if rank == last else "auto"
    attempt("bad order", small, np.zeros((p, 2), np.int64), order=order)
    # the communicator still works
    out = zcoll.alltoall(world, small)
    good = bool((out[:, 0] == np.arange(p)).all())
    everyone = world.gather((results, good), root=0)
    if rank == 0:
        print("<<RESULT", everyone, ">>", flush=True)
    """
)

V_CHECK_JOB = _checking_job(
    """
    # The size rule's limit (4 KiB times the smallest node's ranks, at most 64 KiB).
    pack_limit = _aggregated.pack_limit(zcoll._context.context(world))

    def counts_matrix(p, itemsize, seed):
        # The same on every rank: small, empty, odd, and blocks at and just past the pack limit.
        limit = pack_limit // itemsize
        rng = np.random.default_rng(seed)
        choices = np.array([0, 1, 3, 17, limit, limit + 1])
        return choices[rng.choice(6, (p, p), p=[0.2, 0.25, 0.2, 0.2, 0.075, 0.075])]

    for forced in (None, True, False):  # the size rule, all in the round, all rank to rank
        for name, comm in comms.items():
            _aggregated.force(comm, forced)
            p, r = comm.size, comm.rank
            for dt in ("i1", "f8", "c16", "?") if name == "world" else ("f8",):
                itemsize = np.dtype(dt).itemsize
                c = counts_matrix(p, itemsize, 11 + p)
                rng = np.random.default_rng(5 + r)
                raw = rng.integers(0, 256, int(c[r].sum()) * itemsize, np.uint8)
                send = raw.view(dt) if dt != "?" else raw.view(np.bool_) & True
                expect = np.empty(int(c[:, r].sum()) * itemsize, np.uint8)
                comm.Alltoallv([send.view(np.uint8), c[r] * itemsize],
                               [expect, c[:, r] * itemsize])  # fmt: skip
                recv = np.zeros(int(c[:, r].sum()), dt)
                zcoll.alltoallv(comm, [send, c[r]], [recv, c[:, r]])
                check((forced, name, dt, "alltoallv"), recv, expect)
                # in place: a symmetric matrix
                sym = np.minimum(c, c.T)
                buf = rng.integers(0, 256, int(sym[r].sum()) * itemsize, np.uint8)
                expect_ip = np.empty_like(buf)
                comm.Alltoallv([buf, sym[r] * itemsize], [expect_ip, sym[r] * itemsize])
                zcoll.alltoallv(comm, zcoll.IN_PLACE, [buf.view(dt), sym[r]])
                check((forced, name, dt, "alltoallv in place"), buf, expect_ip)
                # allgatherv, and in place
                mine = raw[: int(c[r, 0]) * itemsize]
                counts = c[:, 0] * itemsize
                expect_g = np.empty(int(counts.sum()), np.uint8)
                comm.Allgatherv(mine, [expect_g, counts])
                got = zcoll.allgatherv(comm, mine.view(dt))
                check((forced, name, dt, "allgatherv"), got, expect_g)
                displs = np.concatenate(([0], np.cumsum(c[:-1, 0])))
                gathered = np.zeros(int(c[:, 0].sum()), dt)
                gathered.view(np.uint8)[displs[r] * itemsize :][: mine.size] = mine
                zcoll.allgatherv(comm, zcoll.IN_PLACE, [gathered, c[:, 0]])
                check((forced, name, dt, "allgatherv in place"), gathered, expect_g)
            # a neighbourhood call on a periodic ring (blocks to both sides, across nodes)
            ring = comm.Create_cart([p], periods=[True])
            _aggregated.force(ring, forced)
            k = 5 + ring.rank
            send = np.arange(2 * 40, dtype=np.int32).reshape(2, 40) + 1000 * ring.rank
            sc = [k % 40, (k + 3) % 40]
            below, above = ring.Shift(0, 1)
            rc = [(5 + below + 3) % 40, (5 + above) % 40]
            expect = np.zeros(80, np.int32)
            ring.Neighbor_alltoallv([send, (sc, [0, 40])], [expect, (rc, [0, 40])])
            got = np.zeros(80, np.int32)
            zcoll.neighbor_alltoallv(ring, [send, (sc, [0, 40])], [got, (rc, [0, 40])])
            check((forced, name, "neighbor_alltoallv"), got, expect)
            ring.Free()
    for comm in comms.values():
        _aggregated.force(comm, None)
    # Counts that differ across nodes (last rank expects one more from rank 0, on both sides of
    # the pack limit): every rank raises, no receive buffer is touched, the comm still works.
    p, r = world.size, world.rank
    errors = []
    for extra in (1, pack_limit):
        sc = np.full(p, 2)
        sc[-1] = extra if r == 0 else 2
        rc = np.full(p, 2)
        rc[0] = extra + 1 if r == p - 1 else 2
        send = np.ones(int(sc.sum()), np.uint8)
        recv = np.full(int(rc.sum()), 7, np.uint8)
        try:
            zcoll.alltoallv(world, [send, sc], [recv, rc])
            errors.append("no error")
        except ValueError as exc:
            errors.append("counts differ" in str(exc) and bool((recv == 7).all()))
    out = zcoll.alltoallv(world, [np.full(p, r, np.int64), np.ones(p, int)],
                          [np.zeros(p, np.int64), np.ones(p, int)])  # fmt: skip
    errors.append(bool((out == np.arange(p)).all()))
    if errors != [True, True, True]:
        bad.append(("errors", errors))
    """
)

CONFIGS = [(4, 1), (4, 2), (5, 2), (5, 3), (6, 2), (6, 3), (8, 2), (8, 3)]


def _run(tmp_path, script: str, ranks: int, node: int, timeout: str = "60"):
    path = tmp_path / "job.py"
    path.write_text(script)
    env = job_env(ZCOLL_VIRTUAL_NODE_SIZE=str(node), ZCOLL_TIMEOUT=timeout)
    env["OMPI_MCA_mpi_yield_when_idle"] = "1"
    proc = run_job(mpiexec(ranks) + [sys.executable, str(path)], env, timeout=240)
    found = re.findall(r"<<RESULT (.*?) >>", proc.stdout, re.S)
    assert found, f"no result:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return found[0] if len(found) == 1 else found


V_CONFIGS = [(4, 1), (4, 2), (5, 2), (6, 3), (8, 3)]

# The checking jobs of one layout run as one mpiexec job (a job's start costs 2-3 s at P = 8
# here, more than most parts): each part's differences are reported apart, under its own test.
# alltoall's part runs last, since it leaves its packing forced.
_PARTS = {"allgather": AG_CHECK_JOB, "reductions": RED_CHECK_JOB, "irregular": V_CHECK_JOB}
_PARTS["alltoall"] = CHECK_JOB
_layout_results: dict[tuple[int, int], dict[str, str]] = {}


def _one_job(parts: list[str]) -> str:
    """The jobs of `parts` run one after another in one script, each reporting its own result."""
    head = len(_JOB_HEAD)
    bodies = [_PARTS[name][head : -len(_JOB_TAIL)] for name in parts]
    return _JOB_HEAD + ("\n" + _JOB_TAIL + "bad.clear()\n").join(bodies) + _JOB_TAIL


def _layout_result(tmp_path, part: str, ranks: int, node: int) -> str:
    """`part`'s result on (ranks, node), from the layout's one job (run by its first test)."""
    if (ranks, node) not in _layout_results:
        parts = list(_PARTS) if (ranks, node) in V_CONFIGS else ["alltoall"]
        results = _run(tmp_path, _one_job(parts), ranks, node)
        results = [results] if isinstance(results, str) else results
        assert len(results) == len(parts), f"{len(results)} results for {parts}: {results}"
        _layout_results[ranks, node] = dict(zip(parts, results))
    return _layout_results[ranks, node][part]


@alone
@pytest.mark.parametrize(("ranks", "node"), CONFIGS, ids=[f"P{p}-node{k}" for p, k in CONFIGS])
def test_alltoall_across_nodes_matches_mpi(tmp_path, ranks, node):
    """Every dtype family, zero/one/odd block lengths (and 4099, whose messages are packed in
    shares), private, arena and mixed buffers (each rank packing its own blocks when one is
    private), in place and recvbuf=None, on WORLD, a dup and a split with reversed keys;
    aggregated and direct."""
    assert _layout_result(tmp_path, "alltoall", ranks, node) == "OK"


over_v_configs = pytest.mark.parametrize(
    ("ranks", "node"), V_CONFIGS, ids=[f"P{p}-node{k}" for p, k in V_CONFIGS]
)


@alone
@over_v_configs
def test_allgather_across_nodes_matches_mpi(tmp_path, ranks, node):
    """allgather with its blocks in the round between nodes (the size rule), all in it, none
    in it (the node's part, then the concurrent exchange or rank to rank): every dtype family,
    zero/one/odd blocks and blocks at and just past the limit, private, arena and mixed
    buffers, in place and recvbuf=None, on WORLD, a dup and a split with reversed keys."""
    assert _layout_result(tmp_path, "allgather", ranks, node) == "OK"


@alone
@over_v_configs
def test_reductions_across_nodes_match_mpi(tmp_path, ranks, node):
    """allreduce (and in place), reduce, reduce_scatter_block and bcast across nodes, whole in
    the round (the size rule, or forced), or spread over the ranks (past the limit, or forced),
    bit for bit against mpi4py on small integer values: numeric dtypes, sum/max/min/bor,
    one element, odd counts and counts at and just past the limit, on WORLD, a dup and a split
    with reversed keys; past the limit with the spread's messages cut into many short segments
    (in place and not, roots on every node, private and arena buffers). Then a size
    that differs on one rank, on both sides of the limit: ValueError everywhere, no result
    written, the communicator works afterwards."""
    assert _layout_result(tmp_path, "reductions", ranks, node) == "OK"


@alone
@over_v_configs
def test_irregular_across_nodes_matches_mpi(tmp_path, ranks, node):
    """alltoallv (and in place), allgatherv (and in place) and a ring's neighbor_alltoallv
    across nodes, bit for bit against mpi4py: random counts with empty and odd blocks and
    blocks at and just past the pack limit, on WORLD, a dup and a split with reversed keys;
    the size rule, everything carried in the round, everything rank to rank. Then counts that
    differ between nodes (a small block and one past the limit): every rank raises ValueError,
    no receive buffer touched, the communicator works afterwards."""
    assert _layout_result(tmp_path, "irregular", ranks, node) == "OK"


@alone
@pytest.mark.parametrize(("ranks", "node"), [(4, 2), (5, 2)], ids=["P4-node2", "P5-node2"])
def test_calls_that_differ_between_nodes(tmp_path, ranks, node):
    """Bad input on the last rank only: every rank of every node raises the same type at once
    (not a timeout: ZCOLL_TIMEOUT is 60 s and the job has 240 s for five calls), the receive
    buffers are untouched, and the communicator works afterwards."""
    result = eval(_run(tmp_path, ERROR_JOB, ranks, node))  # noqa: S307 - our own job's repr
    expected = ["ValueError"] * 4 + ["TypeError", "ValueError", "ValueError"]
    for rank, (results, good) in enumerate(result):
        kinds = [kind for _, kind, _ in results]
        assert kinds == expected, f"rank {rank}: {results}"
        assert all(untouched for _, _, untouched in results), f"rank {rank}: {results}"
        assert good, f"rank {rank}: the communicator is unusable afterwards"


MISMATCH_JOB = textwrap.dedent(
    """
    import numpy as np
    from mpi4py import MPI
    import zcoll
    from zcoll import _core

    _core.mpi_library_matches = lambda version: False  # as with another MPI than mpi4py's
    comm = MPI.COMM_WORLD
    p = comm.size
    calls = [
        lambda: zcoll.alltoall(comm, np.zeros((p, 2))),
        lambda: zcoll.allgather(comm, np.zeros(2), np.zeros((p, 2))),
        lambda: zcoll.allreduce(comm, np.ones(3)),
        lambda: zcoll.bcast(comm, np.ones(3)),
        lambda: zcoll.alltoallv(comm, np.zeros(p), np.zeros(p)),
        lambda: zcoll.alltoall_init(comm, np.zeros((p, 2))),
    ]
    seen = []
    for call in calls:
        try:
            call()
            seen.append("returned")
        except RuntimeError as exc:
            seen.append("named" if "mpi4py runs on" in str(exc) else str(exc))
    node = comm.Split(comm.rank // 2)  # one (virtual) node: no MPI call of zcoll's own
    total = zcoll.allreduce(node, np.ones(3))
    seen.append(bool((total == node.size).all()))
    everyone = comm.gather(seen)
    if comm.rank == 0:
        print(f"<<RESULT {everyone!r} >>", flush=True)
    """
)


@alone
def test_calls_across_nodes_need_mpi4pys_mpi_library(tmp_path):
    """Where the extension cannot call mpi4py's MPI library (another library, or a build
    without MPI: simulated), every call on a communicator spanning nodes raises RuntimeError
    on every rank, naming both libraries, and calls on one node still work."""
    result = eval(_run(tmp_path, MISMATCH_JOB, 4, 2))  # noqa: S307 - our own job's repr
    assert result == [["named"] * 6 + [True]] * 4, result


KILL_JOB = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    import numpy as np
    from mpi4py import MPI
    import zcoll
    from zcoll import _aggregated

    comm = MPI.COMM_WORLD
    rank, p = comm.rank, comm.size
    victim, out, path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    with open(os.path.join(out, f"pid.{rank}"), "w") as f:
        f.write(str(os.getpid()))
    send = np.full((p, 4), rank, np.int64)
    recv = np.empty_like(send)
    calls = 0


    def report(text):  # into a file too: mpiexec may be ended before it forwards the output
        with open(os.path.join(out, f"report.{rank}"), "w") as f:
            f.write(text)
        os.write(1, text.encode())


    # A rank still here long after the timeout hangs: where it is (Python's stacks without the
    # GIL, then gdb's native ones where gdb is installed) goes to hang.RANK, then it leaves.
    import faulthandler, shutil, subprocess
    hang = open(os.path.join(out, f"hang.{rank}"), "w")
    faulthandler.dump_traceback_later(HANG_AFTER, file=hang)


    def native_stacks():
        time.sleep(HANG_AFTER + 1)
        if shutil.which("gdb"):
            gdb = ["gdb", "-p", str(os.getpid()), "-batch", "-ex", "thread apply all bt"]
            subprocess.run(gdb, stdout=hang, stderr=subprocess.STDOUT, timeout=30)
        hang.flush()
        os._exit(4)


    threading.Thread(target=native_stacks, daemon=True).start()


    if path == "direct":  # blocks rank to rank after the round of records
        _aggregated.force(comm, False)
    # Every call is one crossing of the extension from its second call on: die just before
    # it; "spread-flow" dies by a timer inside its call.
    die_before = path != "spread-flow"
    collective = zcoll.alltoallv if path == "v-round" else zcoll.alltoall
    if path == "allgather":  # an allgather whose blocks travel in the round
        mine = np.full(4, rank, np.int64)
        collective = lambda comm, send, recv: zcoll.allgather(comm, mine, recv)
    if path == "allreduce":  # an allreduce whole in the round

        def collective(comm, send, recv):
            total = zcoll.allreduce(comm, np.ones(4, np.int64))
            recv[:, 0] = np.arange(p) if (total == p).all() else -1

    if path == "spread":  # an allreduce beyond the round's size rule

        def collective(comm, send, recv):
            total = zcoll.allreduce(comm, np.ones(1 << 16, np.int64))
            recv[:, 0] = np.arange(p) if (total == p).all() else -1

    if path == "spread-bcast":  # a bcast beyond the round's size rule, from rank 0

        def collective(comm, send, recv):
            data = np.full(1 << 16, 7 if rank == 0 else 0, np.int64)
            zcoll.bcast(comm, data, root=0)
            recv[:, 0] = np.arange(p) if (data == 7).all() else -1

    if path == "spread-flow":  # an allreduce beyond the rule as it runs (the C++ flow): the
        # victim's timer kills it 2 ms into call 50, wherever the call then is

        def collective(comm, send, recv):
            if calls == 50 and rank == victim:
                threading.Timer(0.002, os.kill, (os.getpid(), signal.SIGKILL)).start()
            total = zcoll.allreduce(comm, np.ones(1 << 20, np.int64))
            recv[:, 0] = np.arange(p) if (total == p).all() else -1

    if path == "plan":  # a persistent plan's runs: blocks between nodes by persistent requests
        plan = zcoll.alltoall_init(comm, send, recv)
        collective = lambda comm, send, recv: plan()
    if path == "transfer-plan":  # zcoll.fft's transfer plan: each run agrees, then subarrays
        from zcoll.fft.pencil import transfer_init

        n = 4 * p
        src = zcoll.zeros(comm, (n // p, n), np.int64)
        dst = zcoll.zeros(comm, (n, n // p), np.int64)
        src[...] = rank
        rows = np.repeat(np.arange(p), n // p)[:, None]
        transfer_plan = transfer_init(comm, src, dst, [n, n], 1, 0)

        def collective(comm, send, recv):
            transfer_plan()
            recv[:, 0] = np.arange(p) if (dst == rows).all() else -1
    try:
        for calls in range(200):
            if die_before and calls == 50 and rank == victim:
                os.kill(os.getpid(), signal.SIGKILL)
            collective(comm, send, recv)
            assert (recv[:, 0] == np.arange(p)).all()
    except zcoll.PeerError as exc:
        start = time.monotonic()  # the next call raises at once
        try:
            collective(comm, send, recv)
            again = "returned"
        except zcoll.PeerError as later:
            again = "at-once" if time.monotonic() - start < 1 else "late"
            again += "-unusable" if "unusable" in str(later) else ""
        report(f"<<PEERERROR rank={rank} call={calls} again={again} {exc}>>")
        os._exit(3)
    report(f"<<DONE rank={rank}>>")
    """
)


@alone
@pytest.mark.parametrize(
    "path",
    [
        "round",
        "direct",
        "v-round",
        "allgather",
        "allreduce",
        "spread",
        "spread-bcast",
        "spread-flow",
        "plan",
        "transfer-plan",
    ],
)
def test_rank_killed_in_the_exchange_between_nodes(tmp_path, path):
    """P = 4 on virtual nodes of 2: rank 2, which sends and receives its node's messages,
    SIGKILLs itself just before call 50 -- an alltoall whose blocks travel in the round
    ("round"), or rank to rank after it ("direct"), an alltoallv ("v-round"), an allgather and
    an allreduce whole in the round, an allreduce and a bcast from rank 0 spread over the
    ranks beyond the round's rule ("spread", "spread-bcast"), a run of an alltoall plan whose
    blocks between nodes go by persistent requests ("plan"), a run of zcoll.fft's transfer
    plan, which agrees across nodes, then sends subarray messages ("transfer-plan") -- or
    (path "spread-flow") 2 ms into an 8 MiB allreduce beyond the rule, by a timer, wherever
    the call then is (most likely in the flow of phases 1-3). Its node-mate sees it die;
    rank 0, which waits for its message, raises PeerError once the timeout (KILL_TIMEOUT) is
    over, and rank 1 when rank 0 leaves (or its own wait gives up); every survivor's next call
    raises at once. No rank finishes, no segment is left in /dev/shm."""
    _kill_rank_2_and_check(tmp_path, path, ZCOLL_VIRTUAL_NODE_SIZE="2")


@alone
@pytest.mark.parametrize("path", ["round", "spread-flow"])
def test_rank_killed_between_emulated_nodes(tmp_path, path):
    """As above on two nodes of MPI's own (tools/emulated-nodes/rsh-agent: each node's ranks
    under their own Open MPI daemon, TCP between the nodes), where zcoll finds the nodes as on
    a real cluster: the victim dies on the other node than rank 0, whose wait for its message
    must give up by the timeout."""
    cluster = emulated_cluster((2, 2))
    if cluster is None:
        pytest.skip("emulated nodes need Open MPI and unshare")
    _kill_rank_2_and_check(tmp_path, path, cluster=cluster)


#: Seconds after which a kill job's rank that is still running shows its stacks and leaves
#: (every rank ends within a few seconds of the kill: KILL_TIMEOUT).
HANG_AFTER = 25

#: ZCOLL_TIMEOUT of the kill jobs: how long rank 0 waits for the dead rank's message before it
#: raises (every call before the kill takes a few ms, so 2 s is far from a false alarm).
KILL_TIMEOUT = 2


#: What a kill job's hung rank shows when Open MPI 4.1 itself never returns: under
#: --enable-recovery, after its TCP BTL reports the dead peer's connection reset, a nonblocking
#: MPI_Testsome spins inside opal_progress's libevent loop (about 3 % of runs beside a build,
#: on emulated nodes only). No bound of zcoll's can end a call that does not return; the test
#: reruns such a job once, and fails on any other hang (README, "Errors").
OPEN_MPI_TCP_LIVELOCK = ("PMPI_Testsome", "opal_progress", "libevent")


def _is_open_mpi_tcp_livelock(stacks: str) -> bool:
    return all(frame in stacks for frame in OPEN_MPI_TCP_LIVELOCK)


def _run_kill_job(out, path, cluster, env_extra):
    """One KILL_JOB under mpiexec, writing to `out`: (the mpiexec result, the ranks' reports,
    {hang file: stacks}), with the checks on pids and /dev/shm."""
    job = out / "job.py"
    job.write_text(KILL_JOB.replace("HANG_AFTER", str(HANG_AFTER)))
    env = job_env(ZCOLL_TIMEOUT=str(KILL_TIMEOUT), **env_extra)
    env["OMPI_MCA_mpi_yield_when_idle"] = "1"
    before = zcoll_shm_entries()
    cmd = mpiexec(4, "--enable-recovery", *cluster)
    cmd += [sys.executable, str(job), "2", str(out), path]
    proc = run_job(cmd, env, timeout=60, ranks_ended=job_ranks_ended(out, 4) if cluster else None)
    pids = read_job_pids(out)
    assert len(pids) == 4, proc.stdout + proc.stderr
    assert not leaked_entries(before, pids), f"left in /dev/shm: {leaked_entries(before, pids)}"
    # The ranks' reports from their files: on emulated nodes the job is ended once its ranks
    # have, which can be before mpiexec forwarded the last rank's output (run_job).
    written = "".join(f.read_text() for f in sorted(out.glob("report.*")))
    hangs = {f.name: f.read_text() for f in sorted(out.glob("hang.*")) if f.stat().st_size}
    return proc, written, hangs


def _kill_rank_2_and_check(tmp_path, path, cluster=(), **env_extra):
    """KILL_JOB at P = 4 on two nodes of 2 (virtual ones by `env_extra`, or emulated by the
    mpiexec options `cluster`): rank 2 dies; the survivors' reports are checked. On emulated
    nodes a job whose only hang is Open MPI's own (OPEN_MPI_TCP_LIVELOCK) runs once more."""
    if not is_open_mpi():
        pytest.skip("needs Open MPI's --enable-recovery to keep the survivors alive")
    for attempt in range(2 if cluster else 1):
        out = tmp_path / f"attempt{attempt}"
        out.mkdir()
        proc, written, hangs = _run_kill_job(out, path, cluster, env_extra)
        if not (hangs and all(map(_is_open_mpi_tcp_livelock, hangs.values()))):
            break
    assert not hangs, f"ranks hung: {hangs}\n{written}"
    assert "<<DONE" not in proc.stdout + written
    found = re.findall(r"<<PEERERROR rank=(\d) call=(\d+) again=(\S+) (.*?)>>", written, re.S)
    reports = {rank: text for rank, _, _, text in found}
    again = {rank: later for rank, _, later, _ in found}
    assert set(again.values()) == {"at-once-unusable"}, again
    assert set(reports) == {"0", "1", "3"}, written + proc.stdout + proc.stderr
    if path == "spread-flow":  # it dies in call 50 or (a late timer) 51, in the flow or not
        calls = {rank: int(call) for rank, call, _, _ in found}
        assert set(calls.values()) <= {50, 51}, written
        assert re.search(r"peer rank\(s\) 2 \(pid \d+\) died", reports["3"]), reports["3"]
        within = rf"did not take part within {KILL_TIMEOUT}\b"
        assert re.search(rf"rank\(s\) \[2(, 3)?\] {within}", reports["0"]), reports
        # Rank 3 leaves once it sees rank 2 die: rank 1 may wait for either, or both.
        late = r"\[(2, 3|2|3)\] did not"
        assert re.search(rf"peer rank\(s\) 0 \(pid \d+\) died|{late}", reports["1"]), reports
        return
    calls = {rank: int(call) for rank, call, _, _ in found}
    assert calls == {"0": 50, "1": 50, "3": 50}, written
    assert re.search(r"peer rank\(s\) 2 \(pid \d+\) died", reports["3"]), reports["3"]
    # A plan's rank 3 posts its blocks before its node barrier finds rank 2 dead, then leaves:
    # they may never reach rank 0, which may name it too.
    late = r"\[2(, 3)?\]" if path in ("plan", "transfer-plan") else r"\[2\]"
    within = rf"did not take part within {KILL_TIMEOUT}\b"
    assert re.search(rf"rank\(s\) {late} {within}", reports["0"]), reports["0"]


def test_messages_per_call():
    """N * (N - 1) aggregated; direct adds one per pair of ranks on different nodes."""
    assert _aggregated.messages_per_call([2, 2, 2, 2], aggregate=True) == 12
    assert _aggregated.messages_per_call([2, 2, 2, 2], aggregate=False) == 12 + 8 * 6
    assert _aggregated.messages_per_call([2, 2, 1], aggregate=True) == 6
    assert _aggregated.messages_per_call([2, 2, 1], aggregate=False) == 6 + 2 * 3 + 2 * 3 + 1 * 4
