"""Tuning tables (``python -m zcoll.tune``, ``ZCOLL_TUNING_FILE``) and online tuning.

Tables are written by rank 0 into a directory every rank sees; each test then creates a fresh
communicator (a ``Dup``), whose context is where rank 0 loads the table and broadcasts its
rules. Results are always compared bit for bit with mpi4py's ``Alltoall`` / ``Allgather``.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

import zcoll
from helpers import COMM_KINDS, all_ranks_agree, random_bytes
from zcoll import _context, _core, _node, _tuning, tune

WORLD = MPI.COMM_WORLD
SMALL, LARGE = 8, 256 * 1024  # bytes per block: eager-sized, and past every copy threshold


@pytest.fixture
def shared_dir(tmp_path) -> Path:
    """A directory every rank sees (rank 0's tmp_path)."""
    return Path(WORLD.bcast(str(tmp_path), root=0))


def machine() -> dict:
    return dict(_tuning.current_machine())


def rule(collective="alltoall", ranks=1, low=0, high=None, order="row", copy="temporal", t=None):
    return {
        "collective": collective,
        "ranks_per_node": ranks,
        "min_block": low,
        "max_block": high,
        "order": order,
        "copy": copy,
        "threshold": t,
    }


def document(rules, **changes) -> dict:
    doc = {
        "format": "zcoll-tuning",
        "version": 1,
        "created": "2024-01-01T00:00:00+00:00",
        "zcoll_version": zcoll.__version__,
        "machine": machine(),
        "rules": rules,
    }
    doc.update(changes)
    return doc


def every_node_size(**fields) -> list[dict]:
    """One rule per collective and node size 1..P (so it applies on every communicator)."""
    return [
        rule(collective=c, ranks=n, **fields)
        for c in ("alltoall", "allgather")
        for n in range(1, WORLD.size + 1)
    ]


def publish(path: Path, content) -> None:
    """Rank 0 writes `content` (JSON-able, bytes or str) to `path`; every rank waits."""
    if WORLD.rank == 0:
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif isinstance(content, str):
            path.write_text(content)
        else:
            path.write_text(json.dumps(content))
    WORLD.Barrier()


def fresh(comm: MPI.Comm) -> MPI.Comm:
    """A new communicator like `comm`: its zcoll context (and table) is made on first use."""
    return comm.Dup()


def context_with_table(monkeypatch, path, comm=WORLD):
    """(fresh comm, its context, warnings rank 0 saw) with ZCOLL_TUNING_FILE = `path`."""
    monkeypatch.setenv("ZCOLL_TUNING_FILE", str(path))
    c = fresh(comm)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ctx = _context.context(c)
    return c, ctx, [w for w in seen if issubclass(w.category, RuntimeWarning)]


def check_against_mpi(comm: MPI.Comm, block: int, seed: int = 0) -> None:
    """Both collectives, out of place and in place, with order/copy "auto": same as MPI's."""
    p = comm.size
    send = zcoll.empty(comm, (p, block), np.uint8)
    send[...] = random_bytes(seed + comm.rank, p * block).reshape(p, block)
    want = np.empty_like(send)
    comm.Alltoall(send, want)
    got = zcoll.alltoall(comm, send)
    all_ranks_agree(comm, np.array_equal(got, want), f"alltoall {block} B")
    got[...] = send
    zcoll.alltoall(comm, zcoll.IN_PLACE, got)
    all_ranks_agree(comm, np.array_equal(got, want), f"in-place alltoall {block} B")
    want = np.empty((p, block), np.uint8)
    comm.Allgather(send[0], want)
    got = zcoll.allgather(comm, send[0])
    all_ranks_agree(comm, np.array_equal(got, want), f"allgather {block} B")


# --- the file ----------------------------------------------------------------------------------


def test_round_trip(tmp_path):
    rules = (
        _tuning.TuningRule("alltoall", 2, 0, 100, "eager", "temporal"),
        _tuning.TuningRule("alltoall", 2, 101, None, "hilbert", "hybrid", 65536),
        _tuning.TuningRule("allgather", 4, 0, None, "auto", "streaming"),
    )
    table = _tuning.TuningTable(rules, machine(), "2024-01-01T00:00:00+00:00", "0.1.0")
    path = tmp_path / "sub" / "tuning.json"
    tune.write_table(table, path)
    assert _tuning.load_tuning(path) == table
    assert zcoll.load_tuning(path).rules_for("alltoall", 2) == rules[:2]
    assert [p.name for p in path.parent.iterdir()] == ["tuning.json"]  # no temporary left


def test_tuning_path(monkeypatch, tmp_path):
    monkeypatch.delenv("ZCOLL_TUNING_FILE", raising=False)
    default = zcoll.tuning_path()
    assert default.name == "tuning.json" and "zcoll" in default.parts
    monkeypatch.setenv("ZCOLL_TUNING_FILE", str(tmp_path / "t.json"))
    assert zcoll.tuning_path() == tmp_path / "t.json"


def pull(call: str, ranks: int, min_bytes) -> dict:
    return {"call": call, "ranks_per_node": ranks, "min_bytes": min_bytes}


def _other_machine():
    m = machine()
    m["cpu_model"] = "a CPU that is not this one"
    return m


BAD_TABLES = {
    "malformed_json": b'{"format": "zcoll-tuning", "version": 1, "rules": [',
    "not_utf8": b"\xff\xfe\x00garbage",
    "not_an_object": [],
    "wrong_format": document(every_node_size(), format="mpich"),
    "wrong_version": document(every_node_size(), version=5),
    "bad_model": document([], version=2, reductions=[{"ranks_per_node": 1, "algorithm": "x"}]),
    "negative_cost": document(
        [],
        version=2,
        reductions=[
            {"ranks_per_node": 1, "algorithm": "tiled", "max_bytes": None, "a": -1.0, "b": 0.0}
        ],
    ),
    "version_not_int": document(every_node_size(), version="1"),
    "wrong_machine": document(every_node_size(), machine=_other_machine()),
    "no_machine": document(every_node_size(), machine=None),
    "rules_not_list": document({"a": 1}),
    "overlap": document(
        [rule(ranks=n, high=100, order="hilbert") for n in range(1, WORLD.size + 1)]
        + [rule(ranks=n, low=100, order="column") for n in range(1, WORLD.size + 1)]
    ),
    "unknown_order": document(every_node_size(order="zigzag")),
    "unknown_copy": document(every_node_size(copy="fast")),
    "unknown_collective": document([rule(collective="bcast")]),
    "missing_key": document([{k: v for k, v in rule().items() if k != "order"}]),
    "extra_key": document([{**rule(), "speed": 1}]),
    "string_size": document(every_node_size(low="0")),
    "negative_size": document(every_node_size(low=-1)),
    "huge_size": document(every_node_size(high=2**64)),
    "max_below_min": document(every_node_size(low=10, high=5)),
    "bool_ranks": document([rule(ranks=True)]),
    "threshold_not_hybrid": document(every_node_size(t=4096)),
    "pulls_not_list": document([], version=4, pulls={"bcast": 1}),
    "unknown_pulled_call": document([], version=4, pulls=[pull("alltoall", 1, 0)]),
    "negative_pull": document([], version=4, pulls=[pull("bcast", 1, -1)]),
    "pull_missing_key": document([], version=4, pulls=[{"call": "bcast", "min_bytes": 1}]),
    "two_pulls": document([], version=4, pulls=[pull("reduce", 1, 1), pull("reduce", 1, 2)]),
}


@pytest.mark.parametrize("kind", sorted(BAD_TABLES) + ["missing", "directory", "unreadable"])
def test_bad_tables_fall_back(kind, shared_dir, monkeypatch):
    path = shared_dir / "tuning.json"
    if kind == "missing":
        path = shared_dir / "nothing-here.json"
    elif kind == "directory":
        if WORLD.rank == 0:
            path.mkdir()
        WORLD.Barrier()
    elif kind == "unreadable":  # a path through a regular file (root ignores permissions)
        publish(shared_dir / "file", "x")
        path = shared_dir / "file" / "tuning.json"
    else:
        publish(path, BAD_TABLES[kind])
    if WORLD.rank == 0:
        with pytest.raises((ValueError, OSError)):
            zcoll.load_tuning(path)
    c, ctx, warned = context_with_table(monkeypatch, path)
    try:
        mine = len(warned) == 1 and "ignoring the tuning table" in str(warned[0].message)
        all_ranks_agree(c, mine if c.rank == 0 else not warned, f"warnings: {warned}")
        all_ranks_agree(c, ctx.tuning.rules == (), "no rules")
        order, from_rule = ctx.core.auto_order("alltoall", SMALL, SMALL * c.size)
        all_ranks_agree(c, not from_rule, "built-in order")
        for block in (SMALL, LARGE):
            check_against_mpi(c, block)
    finally:
        c.Free()


def test_missing_default_file_is_silent(monkeypatch, tmp_path):
    monkeypatch.delenv("ZCOLL_TUNING_FILE", raising=False)
    monkeypatch.setattr(_tuning, "tuning_path", lambda: tmp_path / "none.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _tuning._rules_or_warn("table") == ()


def test_off_ignores_the_table(shared_dir, monkeypatch):
    path = shared_dir / "t.json"
    publish(path, document(every_node_size(order="column")))
    previous = zcoll.set_tuning("off")
    try:
        c, ctx, warned = context_with_table(monkeypatch, path)
        _, from_rule = ctx.core.auto_order("alltoall", LARGE, LARGE * c.size)
        all_ranks_agree(c, not from_rule and not warned, "off")
        zcoll.set_tuning("table")  # existing contexts follow
        got = ctx.core.auto_order("alltoall", LARGE, LARGE * c.size)
        want = (_core.ORDERS[_core.default_order(ctx.node_size, LARGE)], False)
        all_ranks_agree(c, got == want, f"rules were never loaded: {got}")
        c.Free()
    finally:
        zcoll.set_tuning(previous)
    with pytest.raises(ValueError, match="mode"):
        zcoll.set_tuning("sometimes")


# --- tables are followed -----------------------------------------------------------------------

FORCED = [
    ("eager", "temporal", None),
    ("row", "streaming", None),
    ("column", "hybrid", 8192),
    ("morton", "hybrid", None),
    ("hilbert", "temporal", None),
    ("auto", "auto", None),
]


@pytest.mark.parametrize("kind", sorted(COMM_KINDS))
@pytest.mark.parametrize(("order", "copy", "threshold"), FORCED)
def test_table_forces_order_and_copy(kind, order, copy, threshold, shared_dir, monkeypatch):
    path = shared_dir / "t.json"
    publish(path, document(every_node_size(order=order, copy=copy, t=threshold)))
    base = COMM_KINDS[kind](WORLD)
    try:
        c, ctx, warned = context_with_table(monkeypatch, path, base)
    finally:
        if base not in (MPI.COMM_WORLD, MPI.COMM_SELF):
            base.Free()
    try:
        all_ranks_agree(c, not warned, f"warnings: {warned}")
        core, p = ctx.core, c.size
        for op in ("alltoall", "allgather"):
            small = core.auto_order(op, SMALL, SMALL * p)
            large = core.auto_order(op, LARGE, LARGE * p)
            builtin = _core.ORDERS[_core.default_order(ctx.node_size, LARGE)]
            fits = SMALL * p <= core.eager_bytes
            want_small = ("eager" if order == "auto" and fits else order, order != "auto")
            if order == "auto" and not fits:
                want_small = (_core.ORDERS[_core.default_order(ctx.node_size, SMALL)], False)
            want_large = (builtin if order in ("eager", "auto") else order, order != "auto")
            all_ranks_agree(c, small == want_small, f"{op} small: {small} != {want_small}")
            all_ranks_agree(c, large == want_large, f"{op} large: {large} != {want_large}")
            plan = core.auto_copy_plan(LARGE, LARGE * p, op)
            if copy == "auto":
                ok = plan == core.auto_copy_plan(LARGE, LARGE * p, "alltoall")
            elif copy == "hybrid" and threshold is None:  # refined, ordinary stores first
                ok = plan == ("temporal", 0)
            else:
                ok = plan == (copy, threshold or 0)
            all_ranks_agree(c, ok, f"{op} copy plan {plan}")
        for block in (SMALL, 1000, LARGE):
            check_against_mpi(c, block, seed=block)
    finally:
        c.Free()


def test_rules_for_other_node_sizes_are_ignored(shared_dir, monkeypatch):
    path = shared_dir / "t.json"
    publish(path, document([rule(ranks=WORLD.size + 1, order="column", copy="streaming")]))
    c, ctx, warned = context_with_table(monkeypatch, path)
    try:
        all_ranks_agree(c, not warned and len(ctx.tuning.rules) == 1, "table loaded")
        _, from_rule = ctx.core.auto_order("alltoall", LARGE, LARGE * c.size)
        plan = ctx.core.auto_copy_plan(LARGE, LARGE * c.size)
        all_ranks_agree(c, not from_rule and plan[0] != "streaming", f"{plan}")
        check_against_mpi(c, LARGE)
    finally:
        c.Free()


def test_block_ranges(shared_dir, monkeypatch):
    """Both ends of a range are included; gaps between ranges keep the built-in rule."""
    n, _ = _node.split_node(WORLD)
    ranks = WORLD.allreduce(n.size, op=MPI.MAX)  # rank 0's node is the largest
    n.Free()
    rules = [
        rule(ranks=r, low=lo, high=hi, order=o)
        for r in range(1, ranks + 1)
        for lo, hi, o in ((0, 99, "column"), (100, 199, "hilbert"), (300, None, "morton"))
    ]
    publish(shared_dir / "t.json", document(rules))
    c, ctx, _ = context_with_table(monkeypatch, shared_dir / "t.json")
    try:
        got = [ctx.core.auto_order("alltoall", b, 1 << 30) for b in (99, 100, 199, 250, 300)]
        builtin = _core.ORDERS[_core.default_order(ctx.node_size, 250)]
        want = [
            ("column", True),
            ("hilbert", True),
            ("hilbert", True),
            (builtin, False),
            ("morton", True),
        ]
        all_ranks_agree(c, got == want, f"{got}")
    finally:
        c.Free()


# --- online ------------------------------------------------------------------------------------


@pytest.mark.parametrize("block", [SMALL, 24 * 1024])
def test_online_settles_and_never_changes_results(block, monkeypatch, tmp_path):
    monkeypatch.setenv("ZCOLL_TUNING_FILE", str(tmp_path / "none.json"))  # no table: no rules
    previous = zcoll.set_tuning("online")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the missing file
            c = fresh(WORLD)
            ctx = _context.context(c)
        p = c.size
        send = zcoll.empty(c, (p, block), np.uint8)
        want = np.empty_like(send)
        trials = _core.ONLINE_RUNS * (len(_core.ORDERS) + 1)
        for call in range(trials + 3):
            send[...] = random_bytes(call * 97 + c.rank, p * block).reshape(p, block)
            c.Alltoall(send, want)
            got = zcoll.alltoall(c, send)
            all_ranks_agree(c, np.array_equal(got, want), f"call {call}")
        choice = ctx.online_choice("alltoall", block)
        if ctx.multi_node:  # the hierarchical path resolves "auto" in the engine, no trials
            all_ranks_agree(c, choice is None, "untouched")
        else:
            allowed = {"auto"} if ctx.node_size == 1 else {*_core.ORDERS, "eager"}
            choices = c.allgather(choice)
            all_ranks_agree(c, choice in allowed, f"settled on {choice}")
            all_ranks_agree(c, len(set(choices)) == 1, f"same everywhere: {choices}")
        c.Free()
    finally:
        zcoll.set_tuning(previous)
    assert zcoll.get_tuning() == previous


def test_online_leaves_table_rules_alone(shared_dir, monkeypatch):
    publish(shared_dir / "t.json", document(every_node_size(order="hilbert")))
    previous = zcoll.set_tuning("online")
    try:
        c, ctx, _ = context_with_table(monkeypatch, shared_dir / "t.json")
        got = zcoll.allgather(c, np.full(4, c.rank, np.int16))
        all_ranks_agree(c, (got == np.arange(c.size)[:, None]).all(), "allgather")
        if not ctx.multi_node:
            all_ranks_agree(c, ctx.online_choice("allgather", 8) == "auto", "the rule decides")
        c.Free()
    finally:
        zcoll.set_tuning(previous)


def test_forced_eager_too_large_is_an_error():
    c = fresh(WORLD)
    ctx = _context.context(c)
    try:
        big = max(ctx.core.eager_bytes, 64) // c.size + 64
        send = zcoll.zeros(c, (c.size, big), np.uint8)
        recv = zcoll.zeros(c, (c.size, big), np.uint8)
        if not ctx.multi_node:
            with pytest.raises(ValueError, match="eager path"):
                ctx.core.alltoall(send, recv, _core.EAGER_ORDER, _core.AUTO_COPY)
    finally:
        c.Free()


# --- python -m zcoll.tune ----------------------------------------------------------------------


def test_tune_quick_writes_a_table_that_loads(shared_dir, monkeypatch, capsys):
    path = shared_dir / "out" / "tuning.json"
    node, _ = _node.split_node(WORLD)
    sizes = set(WORLD.allgather(node.size))
    node_size = node.size
    node.Free()
    # An existing rule for another node size survives; this node size's rules are replaced.
    if WORLD.rank == 0:
        path.parent.mkdir()
    publish(path, document([rule(ranks=node_size + 7, order="column")]))
    argv = ["--quick", "--sizes", "8,4K,64K", "--time-budget", "0.01", "--output", str(path)]
    status = tune.main(argv, comm=WORLD)
    out = capsys.readouterr().out
    if len(sizes) > 1:
        all_ranks_agree(WORLD, status == 2, "uneven nodes refused")
        return
    all_ranks_agree(WORLD, status == 0, f"status {status}")
    table = zcoll.load_tuning(path)
    mine = table.rules_for("alltoall", node_size)
    all_ranks_agree(WORLD, mine and mine[0].min_block == 0 and mine[-1].max_block is None, "")
    all_ranks_agree(WORLD, len(table.rules_for("allgather", node_size)) >= 1, "allgather")
    all_ranks_agree(WORLD, len(table.rules_for("alltoall", node_size + 7)) == 1, "kept")
    models = table.models_for(node_size)
    all_ranks_agree(WORLD, set(models) == set(zcoll.REDUCE_ALGORITHMS), f"models {models}")
    pulls = {r.call: r.min_bytes for r in table.pulls if r.ranks_per_node == node_size}
    all_ranks_agree(WORLD, set(pulls) == set(_tuning.PULLED_CALLS), f"pulls {table.pulls}")
    if WORLD.rank == 0:
        assert "wrote" in out and "ranks/node" in out and "pulls from" in out
    c, ctx, warned = context_with_table(monkeypatch, path)
    try:
        all_ranks_agree(c, not warned, f"{warned}")
        followed = {call: ctx.core.pull_threshold(_tuning.PULLED_CALLS[call]) for call in pulls}
        all_ranks_agree(c, followed == pulls, f"{followed} against {pulls}")
        for block in (8, 4096, 65536):
            check_against_mpi(c, block)
    finally:
        c.Free()


def test_tune_dry_run_writes_nothing(shared_dir):
    path = shared_dir / "dry.json"
    status = tune.main(["--quick", "--sizes", "8", "--dry-run", "--output", str(path)], WORLD)
    all_ranks_agree(WORLD, status in (0, 2) and not os.path.exists(path), "nothing written")


# --- reduction cost models (format version 2) --------------------------------------------------


def model(algorithm, ranks, a, b=0.0, max_bytes=None) -> dict:
    return {"ranks_per_node": ranks, "algorithm": algorithm, "max_bytes": max_bytes, "a": a, "b": b}


@pytest.mark.parametrize("algorithm", zcoll.REDUCE_ALGORITHMS)
def test_reduction_models_choose_auto(algorithm, shared_dir, monkeypatch):
    """A version-2 table whose model makes one algorithm cheapest: algorithm="auto" runs it at
    every size, on every rank, and results stay right."""
    path = shared_dir / "models.json"
    models = [
        model(a, n, 1e-9 if a == algorithm else 1e-3, 0.0 if a == algorithm else 1e-6)
        for a in zcoll.REDUCE_ALGORITHMS
        for n in range(1, WORLD.size + 1)
    ]
    publish(path, document(every_node_size(), version=2, reductions=models))
    c, ctx, warned = context_with_table(monkeypatch, path)
    try:
        all_ranks_agree(c, not warned, f"warnings: {warned}")
        choices = {ctx.core.reduction_choice(n) for n in (8, 4096, 1 << 20)}
        all_ranks_agree(c, choices == {algorithm}, f"auto chose {choices}")
        x = np.arange(1000, dtype=np.int64) + c.rank
        want = np.empty_like(x)
        c.Allreduce(x, want)
        all_ranks_agree(c, np.array_equal(zcoll.allreduce(c, x), want), "result")
    finally:
        c.Free()


def test_version_one_tables_still_load(shared_dir, monkeypatch):
    path = shared_dir / "v1.json"
    publish(path, document(every_node_size(order="column")))
    c, ctx, warned = context_with_table(monkeypatch, path)
    try:
        builtin = ctx.core.reduction_cost(0, 8)  # flat, from the built-in estimate
        all_ranks_agree(c, not warned and ctx.tuning.reductions == () and builtin > 0, "v1")
    finally:
        c.Free()
    if WORLD.rank == 0:
        assert zcoll.load_tuning(path).reductions == ()


def test_models_from_times_pass_through_the_measurements():
    times = {8: {"flat": 1e-6, "tiled": 3e-6}, 1024: {"flat": 5e-6, "tiled": 4e-6},
             4096: {"flat": 4e-6, "tiled": 6e-6}}  # fmt: skip
    models = tune.models_from_times(2, times)
    table = _tuning.TuningTable((), machine(), reductions=tuple(models))
    pieces = table.models_for(2)

    def predict(alg, m):
        for piece in pieces[alg]:
            if piece.max_bytes is None or m <= piece.max_bytes:
                return piece.a + piece.b * m
        raise AssertionError

    for m, row in times.items():
        for alg, t in row.items():
            assert predict(alg, m) == pytest.approx(t)
    assert predict("flat", 2000) == pytest.approx(4e-6)  # a falling segment: flat, at its end
    assert pieces["tiled"][-1].max_bytes is None and pieces["tiled"][0].b == 0


def test_rules_from_winners_merges_and_splits_in_log2():
    a, b = tune.Candidate("eager"), tune.Candidate("hilbert", "hybrid", 4096)
    rules = tune.rules_from_winners("alltoall", 4, {8: a, 16: a, 64: b, 1024: b})
    got = [(r.min_block, r.max_block, r.order, r.threshold) for r in rules]
    assert got == [(0, 32, "eager", None), (33, None, "hilbert", 4096)]  # sqrt(16 * 64) = 32


def test_tuner_times_numa_where_the_node_spans_numa_nodes():
    """On one NUMA node order="numa" is Morton's schedule and is not timed twice; on a node of
    two NUMA nodes it differs, is timed, and comes first, as order="auto" picks it there."""
    one = tune.distinct_orders(4, 8)
    assert "numa" not in one and "morton" in one and len(one) == len(set(one))
    two = tune.distinct_orders(4, 8, [0, 0, 1, 1])
    assert two[0] == "numa" and set(one) < set(two)
    interleaved = tune.distinct_orders(8, 8, [0, 1] * 4)
    assert interleaved[0] == "numa"


# --- pull thresholds (format version 4) --------------------------------------------------------

# Where plain arrays are pulled without a table: auto_policy.hpp's defaults (1 MiB for bcast, 4
# MiB for the reductions), scaled by a forced CMA threshold's ratio to the default 16 KiB.
BUILTIN_PULLS = {
    "bcast": 1 << 20,
    "allreduce": 4 << 20,
    "reduce": 4 << 20,
    "reduce_scatter": 4 << 20,
}
FORCED_CMA = 32 * 1024  # twice the default: twice the thresholds
FORCED_PULLS = {
    "bcast": 2 << 20,
    "allreduce": 8 << 20,
    "reduce": 8 << 20,
    "reduce_scatter": 8 << 20,
}
TUNED_PULL = 64 * 1024  # the table's threshold, below every built-in one
PULL_BYTES = 256 * 1024  # bytes per rank: pulled by the table's rule only


def run_pulled_call(c: MPI.Comm, call: str, seed: int) -> None:
    """`call` on plain int64 arrays of PULL_BYTES per rank, checked against mpi4py's."""
    n = PULL_BYTES // 8 // c.size * c.size
    x = np.random.default_rng(seed + c.rank).integers(-(2**40), 2**40, n)
    if call == "bcast":
        got = x.copy() if c.rank == 0 else np.zeros(n, np.int64)
        want = got.copy()
        c.Bcast(want, root=0)
        zcoll.bcast(c, got, root=0)
    elif call == "reduce_scatter_block":
        want, got = np.empty(n // c.size, np.int64), np.zeros(n // c.size, np.int64)
        c.Reduce_scatter_block(x, want)
        zcoll.reduce_scatter_block(c, x, got)
    else:
        want, got = np.zeros_like(x), np.zeros_like(x)
        getattr(c, call.capitalize())(x, want)
        getattr(zcoll, call)(c, x, got)
        if call == "reduce" and c.rank != 0:
            want[:] = got[:] = 0  # only the root's result is defined
    all_ranks_agree(c, np.array_equal(got, want), f"{call} of {PULL_BYTES} B per rank")


@pytest.mark.parametrize("source", ["table", "forced", "builtin"])
def test_pull_thresholds_come_from_the_table_unless_forced(source, shared_dir, monkeypatch):
    """A version-4 table's pull thresholds decide where bcast and the reductions pull plain
    arrays by CMA on one node (seen in the ranks' CMA counts), unless ZCOLL_CMA_BYTES forces
    the exchanges' threshold; results are mpi4py's either way."""
    path = shared_dir / "pulls.json"
    rules = [pull(call, n, TUNED_PULL) for call in _tuning.PULLED_CALLS for n in range(1, 9)]
    publish(path, document([], version=4, pulls=[] if source == "builtin" else rules))
    if source == "forced":
        monkeypatch.setenv("ZCOLL_CMA_BYTES", str(FORCED_CMA))
    c, ctx, warned = context_with_table(monkeypatch, path)
    try:
        all_ranks_agree(c, not warned, f"warnings: {warned}")
        want = {
            "table": dict.fromkeys(BUILTIN_PULLS, TUNED_PULL),
            "forced": FORCED_PULLS,
            "builtin": BUILTIN_PULLS,
        }[source]
        got = {op: ctx.core.pull_threshold(op) for op in BUILTIN_PULLS}
        all_ranks_agree(c, got == want, f"thresholds {got}")
        forced = ctx.core.cma_bytes
        all_ranks_agree(c, forced == (FORCED_CMA if source == "forced" else None), f"{forced}")
        works = ctx.node_size == 1 or ctx.core.probe_cma()
        # Across nodes these calls stage their node parts (their inputs travel through MPI).
        should_pull = source == "table" and ctx.node_size > 1 and not ctx.multi_node
        for i, call in enumerate(_tuning.PULLED_CALLS):
            before = ctx.core.cma_moves
            run_pulled_call(c, call, seed=100 * i)
            pulled = c.allreduce(ctx.core.cma_moves - before) > 0
            all_ranks_agree(c, pulled == (should_pull and works), f"{call} pulled: {pulled}")
    finally:
        c.Free()


def test_pull_thresholds_round_trip(tmp_path):
    pulls = (_tuning.PullRule("bcast", 2, 5 << 20), _tuning.PullRule("reduce", 4, 3 << 20))
    table = _tuning.TuningTable((), machine(), pulls=pulls)
    tune.write_table(table, tmp_path / "t.json")
    assert _tuning.load_tuning(tmp_path / "t.json").pulls == pulls
    got = _tuning.pull_thresholds(pulls, 2)
    assert got == {"bcast": 5 << 20, "allreduce": None, "reduce": None, "reduce_scatter": None}


def test_pull_threshold_from_times():
    """Least summed relative loss: an isolated slow round moves the threshold only as far as it
    costs; boundaries lie halfway in log2 between the measured sizes; a built-in threshold
    within 3% per size of the best stays."""
    k = 1024
    far = 1 << 40  # a built-in threshold beyond every size: never kept here

    def times(*pulled_over_staged):
        return {
            (256 * k) << i: {"staged": 1.0, "pulled": ratio}
            for i, ratio in enumerate(pulled_over_staged)
        }

    # pulled slower to 1 MiB, faster from 2 MiB: pull from sqrt(1 MiB * 2 MiB) + 1
    from_2m = math.isqrt(2 << 40) + 1
    assert tune.pull_threshold_from(times(2, 2, 2, 0.5, 0.5), far) == from_2m
    # one noisy win at 512 KiB and one noisy loss at 4 MiB do not move it
    assert tune.pull_threshold_from(times(2, 0.99, 2, 0.5, 1.01, 0.5), far) == from_2m
    assert tune.pull_threshold_from(times(0.5, 0.5), far) == 256 * k  # from the first size
    assert tune.pull_threshold_from(times(2, 2), 0) == 512 * k + 1  # beyond the largest
    # the built-in 2 MiB is 2% behind the best at 1 MiB: within 3% per size, it stays
    assert tune.pull_threshold_from(times(2, 2, 0.98, 1.02, 0.5), 2 << 20) == 2 << 20
    # at 1 MiB it loses 2x: the table moves it
    assert tune.pull_threshold_from(times(2, 2, 2, 0.5, 0.5), 1 << 20) == from_2m
