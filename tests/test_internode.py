"""allgather across nodes: the leaders' concurrent exchange (zcoll._internode) and the direct
path, bit for bit against mpi4py's Allgather, on virtual nodes of 1, 2 and 3 ranks.

Each test makes its own communicators with ZCOLL_VIRTUAL_NODE_SIZE set for them (a context
reads it when it is made), so every P of the suite runs every node size: at P = 4, 5, 6, 8
that includes uneven nodes (5 ranks in nodes of 2: 2, 2, 1) and node counts that are not
powers of two. Run e.g. ``python tests/run_mpi.py -n 4 5 6 8 --no-virtual-nodes --
tests/test_internode.py``.
"""

from __future__ import annotations

import json
import os
from collections import Counter, namedtuple

import numpy as np
import pytest
from mpi4py import MPI

import zcoll
from helpers import all_ranks_agree
from zcoll import _aggregated, _context, _core, _internode, _registry, _tuning

DIRECT = _internode.Choice(_internode.DIRECT)
CHOICES = {
    "direct": DIRECT,
    **{f"C{c}": _internode.Choice(_internode.CONCURRENT, c) for c in (1, 2, 4)},
}
DTYPES = [
    np.bool_,
    np.int8,
    np.uint8,
    np.int16,
    np.uint16,
    np.int32,
    np.uint32,
    np.int64,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
    np.complex64,
    np.complex128,
]
NODE_SIZES = (1, 2, 3)


def _reversed(comm: MPI.Comm) -> MPI.Comm:
    return comm.Split(0, key=comm.size - 1 - comm.rank)


def _interleaved(comm: MPI.Comm) -> MPI.Comm:
    """Even world ranks first: a node's comm ranks are not contiguous."""
    return comm.Split(0, key=(comm.rank % 2) * comm.size + comm.rank)


COMM_KINDS = {"world": lambda c: c.Dup(), "split_reversed": _reversed, "interleaved": _interleaved}


@pytest.fixture
def node_comm(monkeypatch):
    """make(kind, k): a new communicator of `kind` over COMM_WORLD on virtual nodes of k ranks
    (None, on every rank, when it spans one node); freed after the test."""
    made = []

    def make(kind: str, k: int) -> MPI.Comm | None:
        monkeypatch.setenv("ZCOLL_VIRTUAL_NODE_SIZE", str(k))
        comm = COMM_KINDS[kind](MPI.COMM_WORLD)
        made.append(comm)
        return comm if _context.context(comm).multi_node else None

    yield make
    for comm in made:
        comm.Free()


@pytest.fixture
def forced():
    """force(comm, choice): the inter-node method of the allgathers on `comm` in this test;
    undone after it (before node_comm frees the communicators)."""
    touched = []

    def force(comm, choice):
        touched.append(comm)
        return _internode.force(comm, choice)

    yield force
    for comm in touched:
        _internode.force(comm, None)


def _data(dtype, n: int, rank: int, seed: int) -> np.ndarray:
    """Seeded values of every kind the dtype holds (the bits are what is compared)."""
    rng = np.random.default_rng([seed, rank])
    raw = rng.integers(0, 256, n * np.dtype(dtype).itemsize, dtype=np.uint8)
    if np.dtype(dtype) == np.bool_:
        raw %= 2
    return raw.view(dtype)


def _expected(comm: MPI.Comm, send: np.ndarray) -> np.ndarray:
    ref = np.empty((comm.size, *send.shape), send.dtype)
    comm.Allgather([send.view(np.uint8), MPI.BYTE], [ref.view(np.uint8), MPI.BYTE])
    return ref


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("choice", list(CHOICES))
@pytest.mark.parametrize("k", NODE_SIZES)
def test_allgather_bits(node_comm, forced, choice, k):
    """Every dtype, odd and zero-size blocks, in place and not, arena and private buffers, on
    WORLD (a dup), a reversed split and an interleaved split."""
    checked = 0
    for kind in COMM_KINDS:
        comm = node_comm(kind, k)
        if comm is None:
            continue
        forced(comm, CHOICES[choice])
        for i, dtype in enumerate(DTYPES):
            n = (0, 1, 3, 7, 33)[i % 5]
            send = _data(dtype, n, comm.rank, seed=i)
            ref = _expected(comm, send)
            where = f"{kind} k={k} {choice} {np.dtype(dtype)} n={n}"
            # private buffers, a new arena result, in place in an arena array
            private = np.full_like(ref, 1)
            zcoll.allgather(comm, send, private)
            fresh = zcoll.allgather(comm, send)
            inplace = zcoll.zeros(comm, ref.shape, dtype)
            inplace[comm.rank] = send
            zcoll.allgather(comm, zcoll.IN_PLACE, inplace)
            ok = all(_same_bits(r, ref) for r in (private, fresh, inplace))
            all_ranks_agree(comm, ok, where)
            checked += 1
    if not MPI.COMM_WORLD.allreduce(checked):
        pytest.skip(f"one node at P={MPI.COMM_WORLD.size} with nodes of {k}")


@pytest.mark.parametrize("choice", list(CHOICES))
def test_split_blocks(node_comm, forced, choice):
    """Blocks of SPLIT_BYTES and more (halves by pair and co-pair), of an odd size, private
    and in place, on nodes of 2 with non-contiguous comm ranks."""
    comm = node_comm("interleaved", 2)
    if comm is None:
        pytest.skip("one node")
    forced(comm, CHOICES[choice])
    n = _internode.SPLIT_BYTES + 5
    send = _data(np.uint8, n, comm.rank, seed=99)
    ref = _expected(comm, send)
    private = np.zeros_like(ref)
    zcoll.allgather(comm, send, private)
    inplace = np.zeros_like(ref)
    inplace[comm.rank] = send
    zcoll.allgather(comm, zcoll.IN_PLACE, inplace)
    all_ranks_agree(comm, _same_bits(private, ref) and _same_bits(inplace, ref), choice)


def test_repeated_calls_reuse_schedule(node_comm, forced):
    """Many calls of alternating sizes (cached datatypes reused and evicted) stay exact."""
    comm = node_comm("interleaved", 2)
    if comm is None:
        pytest.skip("one node")
    forced(comm, CHOICES["C2"])
    ok = True
    for step in range(24):
        n = 1 + step % 11  # more sizes than the cache holds
        send = _data(np.int32, n, comm.rank, seed=step)
        ok &= _same_bits(zcoll.allgather(comm, send), _expected(comm, send))
    all_ranks_agree(comm, ok)


_Message = namedtuple("_Message", "source dest round content part preamble tag")


def _schedule(nodes: int, concurrency: int, split: bool = False) -> list[_Message]:
    """The engine's schedule of the leaders' concurrent exchange (leaders_exchange.hpp)."""
    return [_Message(*m) for m in _core.leaders_schedule(nodes, concurrency, split)]


def _simulate(nodes: int, concurrency: int, split: bool) -> bool:
    """The schedule's messages, round by round: a node only sends blocks it holds, no two
    messages of a round share (source, dest, tag), and every node ends with every block,
    each received exactly once per part."""
    messages = _schedule(nodes, concurrency, split)
    rounds = 1 + max((m.round for m in messages), default=-1)
    for part in (0, 1) if split else (0,):
        held = {n: {n} for n in range(nodes)}
        received: Counter = Counter()
        for r in range(rounds):
            now = [m for m in messages if m.round == r]
            keys = Counter((m.source, m.dest, m.tag) for m in now)
            if keys and max(keys.values()) > 1:
                return False
            mine = [m for m in now if m.part == part]
            if any(not set(m.content) <= held[m.source] or m.source == m.dest for m in mine):
                return False
            for m in mine:
                held[m.dest].update(m.content)
                received.update((m.dest, c) for c in m.content)
        if any(held[n] != set(range(nodes)) for n in held) or set(received.values()) - {1}:
            return False
    return True


@pytest.mark.parametrize("k", NODE_SIZES)
def test_allgather_beyond_the_round_runs_in_one_crossing(node_comm, forced, k):
    """An allgather beyond the round runs in the extension's one crossing from its first call
    (bit for bit, in place and not), its blocks rank to rank or by the leaders' concurrent
    exchange as the crossing policy routes them: the engine decides, nothing is remembered
    from a Python call."""
    comm = node_comm("split_reversed", k)
    if comm is None:
        pytest.skip(f"one node at P={MPI.COMM_WORLD.size} with nodes of {k}")
    count = 64 * 1024 // 8 + 1  # beyond the round's largest block (64 KiB)
    send = _data(np.float64, count, comm.rank, seed=17)
    ref = _expected(comm, send)
    op = _registry.OPS[_registry.ALLGATHER]

    def one_crossing(sendbuf, recvbuf):
        return _core.fast_collective(op, comm, sendbuf, recvbuf, "auto", "auto")

    private = np.full_like(ref, 1)
    inplace = zcoll.zeros(comm, ref.shape, np.float64)
    inplace[comm.rank] = send
    ran = one_crossing(send, private) is private
    ran &= one_crossing(zcoll.IN_PLACE, inplace) is inplace
    ok = ran and _same_bits(private, ref) and _same_bits(inplace, ref)
    all_ranks_agree(comm, ok, "one crossing")
    forced(comm, _internode.Choice(_internode.CONCURRENT, 2))
    all_ranks_agree(comm, _same_bits(zcoll.allgather(comm, send), ref), "concurrent")
    private = np.full_like(ref, 1)
    ran = one_crossing(send, private) is private
    all_ranks_agree(comm, ran and _same_bits(private, ref), "forced concurrent, one crossing")
    forced(comm, DIRECT)
    other = send[: count - 3].copy()
    private = np.full_like(_expected(comm, other), 1)
    ran = one_crossing(other, private) is private
    all_ranks_agree(comm, ran and _same_bits(private, _expected(comm, other)), "forced direct")
    forced(comm, None)
    private = np.full_like(ref, 1)
    ran = one_crossing(send, private) is private
    all_ranks_agree(comm, ran and _same_bits(private, ref), "the policy's again")


@pytest.mark.parametrize("split", [False, True])
def test_schedule_delivers_everything(split):
    bad = [(n, c) for n in range(1, 18) for c in (1, 2, 3, 4, 8) if not _simulate(n, c, split)]
    assert not bad


def test_rounds_follow_the_paper():
    """log2(N / C) steps (the preamble overlaps the first): 16 nodes take 4, 3, 2 rounds
    with C = 1, 2, 4; C >= N is one round."""
    for concurrency, expected in ((1, 4), (2, 3), (4, 2), (16, 1), (32, 1)):
        messages = _schedule(16, concurrency)
        assert 1 + max(m.round for m in messages) == expected
    # at most C exchanges per node in a step (C - 1 more preamble messages in round 0)
    messages = _schedule(16, 4)
    sends = Counter((m.source, m.round) for m in messages if not m.preamble)
    assert max(sends.values()) == 4


def _table(tmp_path, internode: list[dict], version: int = _tuning.VERSION):
    doc = {
        "format": _tuning.FORMAT,
        "version": version,
        "machine": _tuning.current_machine(),
        "rules": [],
        "reductions": [],
        "internode": internode,
    }
    path = tmp_path / "tuning.json"
    path.write_text(json.dumps(doc))
    return path


def _rule(nodes, per_node, low, high, method, concurrency, collective="allgather"):
    return {
        "collective": collective,
        "nodes": nodes,
        "ranks_per_node": per_node,
        "min_block": low,
        "max_block": high,
        "method": method,
        "concurrency": concurrency,
    }


def _comm_with_rank_0_table(node_comm, monkeypatch, tmp_path_factory, rules) -> MPI.Comm:
    """A new communicator on virtual nodes of 2 whose context follows a table of `rules` that
    only rank 0 has (the others must get its rules); skips on one node."""
    path = "/nonexistent/zcoll-tuning.json"
    if MPI.COMM_WORLD.rank == 0:
        path = str(_table(tmp_path_factory.mktemp("t"), rules))
    monkeypatch.setenv("ZCOLL_TUNING_FILE", path)
    comm = node_comm("world", 2)
    if comm is None:
        pytest.skip("one node")
    return comm


def test_table_rules_are_followed(node_comm, monkeypatch, tmp_path_factory):
    """A table's internode rule (rank 0's file, shared) decides; elsewhere the built-in rule."""
    size = MPI.COMM_WORLD.size
    nodes, per_node = -(-size // 2), min(2, size)
    rules = [
        _rule(nodes, per_node, 0, 64, "direct", 0),
        _rule(nodes, per_node, 65, 1000, "concurrent", 4),
    ]
    comm = _comm_with_rank_0_table(node_comm, monkeypatch, tmp_path_factory, rules)
    ctx = _context.context(comm)
    got = [_internode.choose(ctx, b) for b in (8, 64, 65, 1000, 1001)]
    want = [
        DIRECT,
        DIRECT,
        _internode.Choice(_internode.CONCURRENT, 4),
        _internode.Choice(_internode.CONCURRENT, 4),
        DIRECT,  # no rule: the built-in choice
    ]
    all_ranks_agree(comm, got == want, f"{got}")
    send = _data(np.float64, 9, comm.rank, seed=5)  # 72-byte blocks: the C = 4 rule
    all_ranks_agree(comm, _same_bits(zcoll.allgather(comm, send), _expected(comm, send)))


def test_table_versions(tmp_path):
    """Version 3 reads internode rules; version 2 tables (none) are still read; malformed or
    overlapping rules are rejected."""
    rule = _rule(4, 2, 0, None, "concurrent", 2)
    table = _tuning.load_tuning(_table(tmp_path, [rule]))
    assert table.internode == (_tuning.InternodeRule("allgather", 4, 2, 0, None, "concurrent", 2),)
    assert _tuning.TuningTable.from_json(table.as_json()) == table
    assert _tuning.load_tuning(_table(tmp_path, [rule], version=2)).internode == ()
    round_rule = _rule(4, 2, 0, 4096, "round", 0, collective="alltoall")
    assert _tuning.load_tuning(_table(tmp_path, [round_rule])).internode == (
        _tuning.InternodeRule("alltoall", 4, 2, 0, 4096, "round", 0),
    )
    for bad in (
        [dict(rule, method="ring")],
        [dict(rule, concurrency=0)],
        [dict(rule, collective="alltoall")],  # the concurrent exchange is an allgather's
        [dict(round_rule, collective="allreduce")],
        [_rule(4, 2, 0, 100, "direct", 0), _rule(4, 2, 100, None, "concurrent", 2)],
    ):
        with pytest.raises(_tuning.TuningError):
            _tuning.load_tuning(_table(tmp_path, bad))


def _builtin_limit(node_sizes, one_per_sender=False):
    """README's size rule: 4 KiB times the smallest node's ranks, at most 64 KiB (an
    allgather's four times that, at most 64 KiB)."""
    return min(64 * 1024, 4096 * min(node_sizes) * (4 if one_per_sender else 1))


def test_table_round_rules_set_the_limit(node_comm, monkeypatch, tmp_path_factory):
    """A table's "round" rules for this layout move the round's limit of alltoall and
    allgather (rank 0's file, shared); calls beyond the built-in limit then travel in the round,
    bit for bit; tuning "off" restores the built-in limit, "table" the table's."""
    size = MPI.COMM_WORLD.size
    nodes, per_node = -(-size // 2), min(2, size)
    node_sizes = [2] * (size // 2) + [1] * (size % 2)
    rules = [
        _rule(nodes, per_node, 0, 40000, "round", 0, collective="alltoall"),
        _rule(nodes, per_node, 40001, None, "direct", 0, collective="alltoall"),
        _rule(nodes, per_node, 0, 300, "direct", 0),
        _rule(nodes, per_node, 301, None, "round", 0),
    ]
    comm = _comm_with_rank_0_table(node_comm, monkeypatch, tmp_path_factory, rules)
    ctx = _context.context(comm)
    limits = (_aggregated.pack_limit(ctx), _aggregated.pack_limit(ctx, "allgather"))
    all_ranks_agree(comm, limits == (40000, -1), f"{limits}")
    send = _data(np.int32, comm.size * 9000, comm.rank, seed=11)  # 36000-byte blocks
    expect = np.empty_like(send)
    comm.Alltoall(send, expect)
    all_ranks_agree(comm, _same_bits(zcoll.alltoall(comm, send), expect))
    mine = _data(np.int16, 50, comm.rank, seed=12)  # 100-byte blocks: rank to rank now
    all_ranks_agree(comm, _same_bits(zcoll.allgather(comm, mine), _expected(comm, mine)))
    previous = zcoll.set_tuning("off")
    try:
        limits = (_aggregated.pack_limit(ctx), _aggregated.pack_limit(ctx, "allgather"))
        builtin = (_builtin_limit(node_sizes), _builtin_limit(node_sizes, True))
        all_ranks_agree(comm, limits == builtin, f"{limits} != {builtin}")
    finally:
        zcoll.set_tuning(previous)
    all_ranks_agree(comm, _aggregated.pack_limit(ctx) == 40000)


def test_tune_internode_writes_round_rules(tmp_path_factory, monkeypatch):
    """``python -m zcoll.tune --internode`` on the suite's nodes (virtual or emulated runs):
    rules for alltoall and allgather over every block size, each method one the collective
    has; a context made afterwards carries in its round what the first rule says."""
    world = MPI.COMM_WORLD
    if not _context.context(world).multi_node:
        pytest.skip("needs the suite on several nodes (the virtual and emulated runs)")
    from zcoll import tune

    path = tmp_path_factory.mktemp("tune") / "tuning.json"
    path = world.bcast(str(path), root=0)
    argv = ["--quick", "--collectives", "alltoall", "--sizes", "8", "--internode"]
    argv += ["--internode-sizes", "8,16K", "--time-budget", "0.01", "--output", path]
    status = tune.main(argv, comm=world)
    if status == 2:  # uneven nodes (P = 5 on nodes of 2): tune refuses them
        pytest.skip("tune refuses uneven nodes")
    all_ranks_agree(world, status == 0, f"status {status}")
    table = _tuning.load_tuning(path)
    for collective, methods in (("alltoall", {"round", "direct"}), ("allgather", None)):
        mine = [r for r in table.internode if r.collective == collective]
        ok = mine and mine[0].min_block == 0 and mine[-1].max_block is None
        ok = ok and (methods is None or {r.method for r in mine} <= methods)
        all_ranks_agree(world, bool(ok), f"{collective}: {mine}")
    first = next(r for r in table.internode if r.collective == "alltoall")
    want = -1 if first.method != "round" else first.max_block or 2**63 - 1
    monkeypatch.setenv("ZCOLL_TUNING_FILE", path)
    comm = world.Dup()
    try:
        got = _aggregated.pack_limit(_context.context(comm))
        all_ranks_agree(world, got == want, f"{got} != {want} ({first})")
    finally:
        comm.Free()


def test_bench_virtual_node_option(monkeypatch):
    """``--virtual-node-size K`` parses for the collective subcommands and sets the variable;
    once a zcoll context exists it refuses (the node split is already made)."""
    from zcoll.bench import cli

    for command in ("alltoall", "allgather", "allreduce", "alltoallv"):
        assert cli.parse_args([command, "--virtual-node-size", "3"]).virtual_node_size == 3
    monkeypatch.delenv("ZCOLL_VIRTUAL_NODE_SIZE", raising=False)
    cli.apply_virtual_nodes(None)
    assert "ZCOLL_VIRTUAL_NODE_SIZE" not in os.environ
    _context.context(MPI.COMM_WORLD)  # a context exists from here on
    with pytest.raises(RuntimeError, match="before any zcoll context"):
        cli.apply_virtual_nodes(2)


def test_bad_forced_choice_changes_nothing(node_comm):
    """A forced choice that is not one raises ValueError and leaves every setting as it was:
    no choice forced, the extension's crossing mode the policy's, the round's carry."""
    comm = node_comm("world", 2)
    if comm is None:
        pytest.skip(f"one node at P={MPI.COMM_WORLD.size} with nodes of 2")
    assert _internode.force(comm, None) is None
    for bad in (_internode.Choice("sideways"), _internode.Choice(_internode.CONCURRENT, 0)):
        with pytest.raises(ValueError):
            _internode.force(comm, bad)
    assert _context.context(comm).core.nodes_force_allgather_crossing(0) == 0
    assert _aggregated.force(comm, None) is None
    assert _internode.force(comm, None) is None


def test_a_forced_way_is_one_communicators(node_comm):
    """Forcing how calls cross nodes is an option of one communicator's context: another
    communicator on the same nodes keeps the size rule, the policy's allgather crossing and
    the default spread segment; undone, the forced one has them back."""
    forced, other = node_comm("world", 2), node_comm("split_reversed", 2)
    if forced is None or other is None:
        pytest.skip(f"one node at P={MPI.COMM_WORLD.size} with nodes of 2")
    rule = _aggregated.pack_limit(_context.context(other))
    assert rule >= 0
    _internode.force(forced, DIRECT)
    _aggregated.spread_segment(forced, 17 * 64)
    assert _aggregated.pack_limit(_context.context(forced)) == -1
    assert _aggregated.pack_limit(_context.context(other)) == rule
    assert _internode.force(other, None) is None
    assert _aggregated.spread_segment(other, None) is None
    assert _aggregated.spread_segment(forced, None) == 17 * 64
    assert _internode.force(forced, None) == DIRECT
    assert _aggregated.pack_limit(_context.context(forced)) == rule
