"""``python -m zcoll.bench``: every subcommand run in-process at tiny sizes, on every rank.

Each test calls ``zcoll.bench.main([...])`` on every rank of ``MPI.COMM_WORLD`` (the CLI is
collective) with tiny sizes, few iterations and a small time budget, then checks the exit
status on every rank and, on rank 0 (the only rank that writes files), what the ``--json``,
``--csv`` and ``--plot`` files hold; rank 0's verdict is shared so every rank passes or fails
together. Files go to rank 0's ``tmp_path`` (each rank has its own), broadcast to the others.
The expected rows are derived from the options given, never from the code under test.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

import zcoll
from helpers import all_ranks_agree
from zcoll import _aggregated, _timing, bench
from zcoll.bench import collectives, common, crossover, plotting, vcollectives

WORLD = MPI.COMM_WORLD
P = WORLD.size
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FAST = ["--iterations", "3", "--warmup", "1", "--time-budget", "0.01", "--no-progress"]


@pytest.fixture
def outdir(tmp_path) -> Path:
    """Rank 0's tmp_path, the same on every rank (only rank 0 writes or reads in it)."""
    return Path(WORLD.bcast(str(tmp_path) if WORLD.rank == 0 else None, root=0))


def run_main(argv: list[str]) -> int:
    """main(argv) on every rank; asserts every rank returned the same status."""
    status = bench.main(argv)
    statuses = WORLD.allgather(status)
    assert len(set(statuses)) == 1, f"ranks returned different statuses: {statuses}"
    return status


def on_root(check) -> None:
    """Run `check()` (which raises AssertionError on failure) on rank 0; fail on every rank."""
    error = None
    if WORLD.rank == 0:
        try:
            check()
        except AssertionError as exc:
            error = str(exc) or "assertion failed"
    error = WORLD.bcast(error, root=0)
    assert error is None, error


def read_json(path: Path) -> dict:
    with open(path) as f:
        return json.load(f)


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert len(data) > len(PNG_SIGNATURE), f"{path} is empty"
    assert data.startswith(PNG_SIGNATURE), f"{path} is not a PNG"


# --- allreduce / reduce / bcast / barrier -------------------------------------------------------


@pytest.mark.parametrize("command", ["allreduce", "reduce", "bcast"])
def test_reduction_json_csv_plot(command, outdir):
    files = {k: outdir / f"red.{k}" for k in ("json", "csv")} | {"plot": outdir / "red.png"}
    argv = [command, "--sizes", "8,64K", "--algorithms", "flat,tiled,auto", "--check"]
    argv += FAST + ["--rounds", "2"] + [f"--{k}={v}" for k, v in files.items()]
    segment = 4096 if command == "allreduce" else _aggregated.SPREAD_SEGMENT_BYTES
    if command == "allreduce":  # across nodes, the spread's messages in segments of 4 KiB
        argv += ["--spread-segment", "4K"]
    assert run_main(argv) == 0
    assert _aggregated.spread_segment(MPI.COMM_WORLD, None) is None  # the default put back
    methods = {"MPI", "zcoll"} if command == "bcast" else {"MPI", "flat", "tiled", "auto"}
    expected = {(b, m) for b in (8, 65536) for m in methods}
    if command == "allreduce":
        expected |= {(65536, "memcpy"), (8, "alltoall8")}

    def check():
        document = read_json(files["json"])
        rows = document["results"]
        assert {(r["block_bytes"], r["method"]) for r in rows} == expected
        assert all(r["latency_us"] > 0 and r["collective"] == command for r in rows)
        meta = document["metadata"]
        assert meta["collective"] == command and meta["P"] == P
        assert meta["spread_segment"] == segment
        assert meta["speedup_small"] > 0 and meta["speedup_large"] > 0
        if command == "allreduce":
            assert meta["allreduce8_over_alltoall8"] > 0 and "65536" in document["over_memcpy"]
        if command != "bcast":  # sizes where auto ran one of the timed algorithms
            picks = document["pick_over_best"]
            assert set(picks) <= {"8", "65536"} and all(r >= 1 for r in picks.values())
        assert {(int(r["block_bytes"]), r["method"]) for r in read_csv(files["csv"])} == expected
        assert_png(files["plot"])

    on_root(check)


def test_reduction_fresh_method(outdir, capsys):
    """--method fresh: every call on a just-rewritten send buffer, the rewrite timed (row
    "rewrite") and subtracted; --check still compares with MPI's result."""
    path = outdir / "fresh.json"
    argv = ["allreduce", "--sizes", "8,4K", "--algorithms", "flat,auto", "--method", "fresh"]
    assert run_main([*argv, "--check", *FAST, "--json", str(path)]) == 0
    out = capsys.readouterr().out
    methods = {"MPI", "flat", "auto", "rewrite"}
    expected = {(b, m) for b in (8, 4096) for m in methods} | {(8, "alltoall8")}

    def check():
        document = read_json(path)
        rows = document["results"]
        assert {(r["block_bytes"], r["method"]) for r in rows} == expected
        assert all(r["latency_us"] >= 0 for r in rows)
        assert all(r["latency_us"] > 0 for r in rows if r["method"] == "rewrite")
        assert document["metadata"]["bench_method"] == "fresh"
        assert "send buffers rewritten before each call" in out

    on_root(check)


def test_barrier_subcommand(outdir, capsys):
    assert run_main(["barrier", *FAST, "--json", str(outdir / "b.json")]) == 0
    out = capsys.readouterr().out

    def check():
        document = read_json(outdir / "b.json")
        assert {r["method"] for r in document["results"]} == {"MPI", "zcoll"}
        assert document["metadata"]["barrier_speedup"] > 0 and "zcoll.barrier" in out

    on_root(check)


# --- alltoall / allgather ----------------------------------------------------------------------


@pytest.mark.parametrize("method", ["warm", "cold"])
@pytest.mark.parametrize("collective", ["alltoall", "allgather"])
def test_collective_json_csv_plot(collective, method, outdir):
    files = {k: outdir / f"out.{k}" for k in ("json", "csv")} | {"plot": outdir / "out.png"}
    argv = [collective, "--sizes", "8,100", "--orders", "row,morton", "--method", method, "--check"]
    argv += FAST + [f"--{k}={v}" for k, v in files.items()]
    assert run_main(argv) == 0
    expected = {(b, m) for b in (8, 100) for m in ("MPI", "row", "morton")}

    def check():
        document = read_json(files["json"])
        rows = document["results"]
        assert {(r["block_bytes"], r["method"]) for r in rows} == expected
        assert len(rows) == len(expected)
        for r in rows:
            assert r["collective"] == collective and r["P"] == P
            assert r["latency_us"] > 0 and r["iterations"] == 3 and r["warmup"] == 1
            assert r["bench_method"] == method
            assert r["order"] == (None if r["method"] == "MPI" else r["method"])
            assert r["copy"] == (None if r["method"] == "MPI" else "auto")
        meta = document["metadata"]
        assert meta["collective"] == collective and meta["P"] == P and meta["checked"]
        assert meta["bench_method"] == method and meta["copy_modes"] == ["auto"]
        assert document["bandwidth"] == []  # no block reaches 256 KiB
        table = read_csv(files["csv"])
        assert {(int(r["block_bytes"]), r["method"]) for r in table} == expected
        assert all(float(r["latency_us"]) > 0 for r in table)
        assert_png(files["plot"])

    on_root(check)


BETWEEN_NODES = {
    "alltoall": {"xn:aggregated", "xn:direct", "xn:alone", "xn:shares"},
    "allgather": {"xn:round", "xn:direct", "xn:C=1", "xn:C=2", "xn:C=4"},
}


@pytest.mark.parametrize("collective", ["alltoall", "allgather"])
def test_numpy_buffers(collective, outdir):
    """--buffers numpy times zcoll on plain NumPy arrays (checked against MPI; across nodes
    too in the suite's virtual-node runs) and records it."""
    out = outdir / "numpy.json"
    argv = [collective, "--sizes", "8,100", "--orders", "auto", "--buffers", "numpy", "--check"]
    assert run_main(argv + FAST + ["--json", str(out)]) == 0

    def check():
        document = read_json(out)
        assert document["metadata"]["buffers"] == ["numpy"] and document["metadata"]["checked"]
        assert {(r["block_bytes"], r["method"]) for r in document["results"]} == {
            (b, m) for b in (8, 100) for m in ("MPI", "auto")
        }

    on_root(check)


KINDS = ["numpy", "heap", "arena"]


def table_cell(header: str, line: str, title: str) -> str:
    """The cell under column `title` of a table whose cells are right-aligned to its titles."""
    end = header.index(f" {title}") + 1 + len(title)
    return line[:end].split()[-1]


@pytest.mark.parametrize("collective", ["alltoall", "alltoallv", "neighbor_alltoall"])
def test_buffer_kinds_side_by_side(collective, outdir, capsys):
    """--buffers numpy,heap,arena: each zcoll method on each kind in one run (NAME@KIND, each
    checked against MPI), MPI once; a summary line per kind; rows and metadata name the kind.
    The same for the irregular and neighbourhood benches (vcollectives), whose MPI/auto
    column and auto summary follow the first kind's auto."""
    files = {k: outdir / f"kinds.{k}" for k in ("json", "csv")}
    argv = [collective, "--sizes", "8,100", "--orders", "row,auto", "--buffers", ",".join(KINDS)]
    argv += ["--check", *FAST, *(f"--{k}={v}" for k, v in files.items())]
    assert run_main(argv) == 0
    out = capsys.readouterr().out
    names = [f"{order}@{kind}" for order in ("row", "auto") for kind in KINDS]
    irregular = collective != "alltoall"
    fields = vcollectives.FIELDS if irregular else collectives.FIELDS

    def check():
        lines = out.splitlines()
        header = next(line for line in lines if line.split()[:2] == ["block", "MPI"])
        assert header.split()[3 : 3 + len(names)] == names, header  # after "block MPI (us)"
        document = read_json(files["json"])
        rows = document["results"]
        assert {(r["block_bytes"], r["method"]) for r in rows} == {
            (b, m) for b in (8, 100) for m in ["MPI", *names]
        }
        for r in rows:
            order, _, kind = r["method"].partition("@")
            assert r["buffers"] == (kind or None) and r["order"] == (order if kind else None)
        meta = document["metadata"]
        assert meta["buffers"] == KINDS and meta["checked"]
        latency = {(r["block_bytes"], r["method"]): r["latency_us"] for r in rows}
        by_kind = meta["speedup_by_buffers"]
        assert list(by_kind) == KINDS
        for kind in KINDS:
            ratios = {
                b: latency[b, "MPI"] / min(latency[b, f"{o}@{kind}"] for o in ("row", "auto"))
                for b in (8, 100)
            }
            lowest = min(ratios, key=ratios.__getitem__)
            got = by_kind[kind]
            assert got["small"] == pytest.approx(geometric_mean(list(ratios.values())))
            assert got["large"] is None  # no block of 64 KiB or more
            assert got["lowest"] == pytest.approx(ratios[lowest]) and got["lowest_block"] == lowest
            assert (
                f"geomean speedup of best @{kind} method over MPI: blocks <= 16 KiB: "
                f"{got['small']:.2f}x, blocks >= 64 KiB: n/a; lowest {ratios[lowest]:.2f}x at "
            ) in out, out
        if irregular:  # MPI/auto: the first kind's auto
            assert header.split()[-1] == "MPI/auto@numpy", header
            auto = [latency[b, "MPI"] / latency[b, "auto@numpy"] for b in (8, 100)]
            for b, size in ((8, "8 B"), (100, "100 B")):
                line = next(line for line in lines if line.startswith(f"{size:>9}"))
                assert line.split()[-1] == f"{latency[b, 'MPI'] / latency[b, 'auto@numpy']:.2f}x"
            assert meta["geomean_auto_speedup_small"] == pytest.approx(geometric_mean(auto))
            assert "geomean speedup over MPI of auto@numpy: blocks <= 16 KiB: " in out, out
        table = read_csv(files["csv"])
        assert list(table[0]) == list(fields) and "buffers" in fields
        assert {(r["method"], r["buffers"]) for r in table} == {("MPI", "")} | {
            (n, n.partition("@")[2]) for n in names
        }

    on_root(check)


def test_buffer_kinds_side_by_side_allreduce(outdir, capsys):
    """--buffers numpy,heap,arena for allreduce: each algorithm on each kind (checked against
    MPI), MPI, memcpy and alltoall8 once; per kind the speedup, auto/best and the algorithm
    auto ran (private inputs: the numpy kind's), and the summary lines."""
    files = {k: outdir / f"kinds.{k}" for k in ("json", "csv")}
    algorithms = ("flat", "tiled", "auto")
    argv = ["allreduce", "--sizes", "8,64K", "--algorithms", ",".join(algorithms)]
    argv += ["--buffers", ",".join(KINDS), "--check", *FAST, "--rounds", "1"]
    assert run_main(argv + [f"--{k}={v}" for k, v in files.items()]) == 0
    out = capsys.readouterr().out
    names = [f"{a}@{kind}" for a in algorithms for kind in KINDS]
    ctx = zcoll._context.context(WORLD)
    ran = {
        (b, kind): ctx.core.reduction_choice(b, private_inputs=kind == "numpy")
        for b in (8, 65536)
        for kind in KINDS
    }

    def check():
        lines = out.splitlines()
        header = next(line for line in lines if line.split()[:2] == ["bytes", "MPI"])
        assert header.split()[2 : 2 + len(names)] == names, header
        document = read_json(files["json"])
        rows = document["results"]
        assert {(r["block_bytes"], r["method"]) for r in rows} == {
            (b, m) for b in (8, 65536) for m in ["MPI", *names]
        } | {(65536, "memcpy"), (8, "alltoall8")}
        for r in rows:
            kind = r["method"].partition("@")[2]
            assert r["buffers"] == (kind or {"alltoall8": "arena"}.get(r["method"]))
        meta = document["metadata"]
        assert meta["buffers"] == KINDS and list(meta["by_buffers"]) == KINDS
        latency = {(r["block_bytes"], r["method"]): r["latency_us"] for r in rows}
        for kind in KINDS:
            summary = meta["by_buffers"][kind]
            own = {b: {a: latency[b, f"{a}@{kind}"] for a in algorithms} for b in (8, 65536)}
            worst = max(lat["auto"] / min(lat["flat"], lat["tiled"]) for lat in own.values())
            assert summary["auto_over_best_max"] == pytest.approx(worst)
            speedup = latency[8, "MPI"] / own[8]["auto"]
            assert summary["speedup_small"] == pytest.approx(speedup)
            text = f"{summary['speedup_small']:.2f}x"
            assert f"geomean speedup over MPI (auto@{kind}): <= 16 KiB: {text}" in out
            assert f"auto@{kind} / best fixed algorithm@{kind}, worst size: {worst:.2f}" in out
            for b, size in ((8, "8 B"), (65536, "64 KiB")):
                line = next(line for line in lines if line.startswith(f"{size:>9}"))
                cell = table_cell(header, line, f"auto ran@{kind}")
                if not ctx.multi_node:  # across nodes the column says "round" or "spread"
                    assert cell == ran[b, kind], (kind, size, line)
        assert meta["speedup_small"] == meta["by_buffers"]["numpy"]["speedup_small"]
        assert list(read_csv(files["csv"])[0])[-1] == "buffers"

    on_root(check)


@pytest.mark.parametrize("command", ["alltoall", "allreduce", "alltoallv", "neighbor_allgather"])
def test_buffer_kinds_usage(command, capsys):
    """An unknown kind is a usage error; a repeated one counts once."""
    assert run_main([command, "--buffers", "numpy,gpu"]) == 2
    capsys.readouterr()
    args = bench.cli.parse_args([command, "--buffers", "heap,arena,heap"])
    assert args.buffers == ["heap", "arena"]


def test_reduction_summary_leaves_out_zero_latencies():
    """--method fresh can subtract a noisy latency to 0: the summary leaves those ratios out
    instead of dividing by zero."""
    from zcoll.bench import reductions

    by_size = {
        8: {"MPI": 2.0, "flat": 0.0, "auto": 1.0},
        16: {"MPI": 4.0, "flat": 1.0, "auto": 0.0},
    }
    summary = reductions.summarise(by_size, ["flat", "auto"], {}, {8: "flat", 16: "auto"})
    assert summary["speedup_small"] == pytest.approx(2.0)  # 8 B alone: 16 B's auto took 0
    assert summary["auto_over_best_max"] == pytest.approx(0.0)  # 16 B alone
    assert summary["pick_over_best"] == {16: 0.0}


def test_zcoll_methods_on_several_kinds():
    methods = collectives.zcoll_methods(["auto"], ["auto"], True, ["numpy", "heap"])
    assert [(m.name, m.buffers, m.persistent) for m in methods] == [
        ("auto@numpy", "numpy", False),
        ("auto@heap", "heap", False),
        ("auto_init@numpy", "numpy", True),
        ("auto_init@heap", "heap", True),
    ]
    assert [collectives.is_persistent(m.name) for m in methods] == [False, False, True, True]
    assert [m.name for m in collectives.zcoll_methods(["row"], ["auto"], False, ["heap"])] == [
        "row"
    ]


@pytest.mark.parametrize("collective", ["alltoall", "allgather"])
def test_between_nodes_methods(collective, outdir):
    """--between-nodes adds the ways blocks cross nodes (checked against MPI) on a communicator
    spanning nodes (the suite's virtual-node runs), and nothing on one node."""
    out = outdir / "between.json"
    argv = [collective, "--sizes", "64", "--orders", "auto", "--between-nodes", "--check"]
    assert run_main(argv + FAST + ["--json", str(out)]) == 0
    multi_node = zcoll._context.context(WORLD).multi_node

    def check():
        document = read_json(out)
        methods = {r["method"] for r in document["results"]}
        if multi_node:
            assert BETWEEN_NODES[collective] <= methods, methods
        else:
            assert methods == {"MPI", "auto"}
        assert document["metadata"]["checked"]

    on_root(check)


def test_copy_mode_list_names_methods(outdir):
    out = outdir / "modes.json"
    argv = ["alltoall", "--sizes", "64", "--orders", "row,hilbert", "--copy", "auto,streaming"]
    assert run_main(argv + FAST + ["--check", "--json", str(out)]) == 0

    def check():
        rows = read_json(out)["results"]
        got = {r["method"]: (r["order"], r["copy"]) for r in rows}
        assert got == {
            "MPI": (None, None),
            "row/auto": ("row", "auto"),
            "row/streaming": ("row", "streaming"),
            "hilbert/auto": ("hilbert", "auto"),
            "hilbert/streaming": ("hilbert", "streaming"),
        }

    on_root(check)


def test_paired_bandwidth_rows(outdir, monkeypatch):
    # Blocks of 1 KiB and more get the paired measurement (256 KiB by default: too slow here).
    monkeypatch.setattr(collectives, "BANDWIDTH_BLOCKS", 1024)
    out = outdir / "paired.json"
    argv = ["alltoall", "--sizes", "64,2K", "--orders", "row"] + FAST + ["--json", str(out)]
    assert run_main(argv) == 0

    def check():
        document = read_json(out)
        memcpy = [r for r in document["results"] if r["method"] == "memcpy"]
        assert [r["block_bytes"] for r in memcpy] == [2048]
        assert memcpy[0]["rounds"] == collectives.PAIRED_ROUNDS and memcpy[0]["latency_us"] > 0
        (record,) = document["bandwidth"]
        assert record["block_bytes"] == 2048 and record["method"] == "row"
        assert record["received_bytes"] == P * 2048
        ratios = record["round_ratios"]
        assert len(ratios) == collectives.PAIRED_ROUNDS and all(r > 0 for r in ratios)
        assert record["ratio"] == pytest.approx(statistics.median(ratios))
        gbps = P * 2048 / (record["memcpy_us"] * 1e-6) / 1e9
        assert record["memcpy_gbps"] == pytest.approx(gbps)
        assert record["memcpy_us"] == pytest.approx(memcpy[0]["latency_us"])

    on_root(check)


def test_zcoll_methods_naming():
    single = collectives.zcoll_methods(["row", "auto"], ["hybrid"])
    assert [(m.name, m.order, m.copy) for m in single] == [
        ("row", "row", "hybrid"),
        ("auto", "auto", "hybrid"),
    ]
    several = collectives.zcoll_methods(["morton"], ["auto", "temporal"])
    assert [m.name for m in several] == ["morton/auto", "morton/temporal"]


# --- --persistent ------------------------------------------------------------------------------


def mpi_has_persistent(collective: str) -> bool:
    """Whether this MPI library (through mpi4py) makes `collective`'s persistent request, probed
    here directly, independently of the bench; the same answer on every rank."""
    send = np.zeros(P if collective == "alltoall" else 1, np.uint8)
    try:
        request = getattr(WORLD, f"{collective.capitalize()}_init")(send, np.zeros(P, np.uint8))
    except (NotImplementedError, AttributeError, MPI.Exception):
        request = None
    made = WORLD.allreduce(request is not None, op=MPI.LAND)
    if request is not None:
        request.Free()
    return made


def geometric_mean(values) -> float:
    return float(np.exp(np.mean(np.log(values))))


@pytest.mark.parametrize("collective", ["alltoall", "allgather"])
def test_persistent_side_by_side(collective, outdir, capsys):
    files = {k: outdir / f"persistent.{k}" for k in ("json", "csv")} | {"plot": outdir / "p.png"}
    argv = [collective, "--sizes", "8,100", "--orders", "row,auto", "--persistent", "--check"]
    argv += FAST + [f"--{k}={v}" for k, v in files.items()]
    assert run_main(argv) == 0
    out = capsys.readouterr().out
    has_init = mpi_has_persistent(collective)
    methods = ["MPI", "row", "row_init", "auto", "auto_init"] + (["MPI_init"] if has_init else [])
    expected = {(b, m) for b in (8, 100) for m in methods}
    plan_orders = {*zcoll.ORDERS, "eager"}

    def check():
        document = read_json(files["json"])
        rows = document["results"]
        assert {(r["block_bytes"], r["method"]) for r in rows} == expected
        assert len(rows) == len(expected)
        for r in rows:
            assert r["latency_us"] > 0 and r["iterations"] == 3 and r["warmup"] == 1
            assert r["persistent"] == r["method"].endswith("_init"), r
            zcoll_plan = r["method"] in ("row_init", "auto_init")
            assert (r["plan_order"] in plan_orders) if zcoll_plan else r["plan_order"] is None
            assert (r["plan_copy"] in zcoll.COPY_MODES) if zcoll_plan else r["plan_copy"] is None
            if r["method"] in ("row", "row_init", "auto", "auto_init"):
                assert r["order"] == r["method"].removesuffix("_init") and r["copy"] == "auto"
            else:
                assert r["order"] is None and r["copy"] is None
        # order="row" is never resolved to anything else
        assert all(r["plan_order"] == "row" for r in rows if r["method"] == "row_init")
        latency = {(r["block_bytes"], r["method"]): r["latency_us"] for r in rows}

        records = document["persistent"]
        assert [r["block_bytes"] for r in records] == [8, 100]
        for rec in records:
            b = rec["block_bytes"]
            plain, plan = rec["plain_method"], rec["persistent_method"]
            assert plain in ("row", "auto") and plan in ("row_init", "auto_init")
            assert rec["plain_us"] == min(latency[b, "row"], latency[b, "auto"])
            assert rec["persistent_us"] == min(latency[b, "row_init"], latency[b, "auto_init"])
            assert rec["plain_us"] == latency[b, plain]
            assert rec["persistent_us"] == latency[b, plan]
            assert rec["mpi_us"] == latency[b, "MPI"]
            assert rec["barrier_us"] > 0 and rec["barrier_iterations"] == 3
            assert rec["plain_speedup"] == pytest.approx(rec["mpi_us"] / rec["plain_us"])
            assert rec["persistent_speedup"] == pytest.approx(rec["mpi_us"] / rec["persistent_us"])
            assert rec["persistent_vs_plain"] == pytest.approx(
                rec["plain_us"] / rec["persistent_us"]
            )
            assert rec["plan_order"] in plan_orders and rec["plan_copy"] in zcoll.COPY_MODES
            if has_init:
                assert rec["mpi_persistent_us"] == latency[b, "MPI_init"]
                ratio = rec["mpi_persistent_us"] / rec["persistent_us"]
                assert rec["persistent_vs_mpi_persistent"] == pytest.approx(ratio)
            else:
                assert rec["mpi_persistent_us"] is None
                assert rec["persistent_vs_mpi_persistent"] is None

        meta = document["metadata"]
        assert meta["persistent"] is True and meta["orders"] == ["row", "auto"]
        assert (meta["mpi_persistent"] is not None) == has_init
        assert (meta["mpi_persistent_missing"] is None) == has_init
        if not has_init:
            assert f"{collective.capitalize()}_init" in meta["mpi_persistent_missing"]
        for key in ("plain", "persistent"):
            small = geometric_mean([rec[f"{key}_speedup"] for rec in records])
            assert meta[f"geomean_speedup_{key}_small"] == pytest.approx(small)
            assert meta[f"geomean_speedup_{key}_large"] is None  # no block >= 64 KiB
        assert meta["geomean_speedup_small"] == pytest.approx(meta["geomean_speedup_plain_small"])
        assert (meta["geomean_speedup_vs_mpi_persistent_small"] is not None) == has_init

        table = read_csv(files["csv"])
        assert {(int(r["block_bytes"]), r["method"]) for r in table} == expected
        assert {r["method"] for r in table if r["persistent"] == "True"} == {
            m for m in methods if m.endswith("_init")
        }
        assert_png(files["plot"])

        # the table: one title line naming every column, then one line per block
        lines = out.splitlines()
        (title,) = [line for line in lines if line.split()[:3] == ["block", "Barrier", "MPI"]]
        assert title.split() == ["block", "Barrier", "MPI", "(us)", "MPI_init", "row",
                                 "row_init", "auto", "auto_init", "plain", "persistent", "vs",
                                 "init"]  # fmt: skip
        body = lines[lines.index(title) + 1 : lines.index(title) + 3]
        for line, b in zip(body, (8, 100)):
            cells = line.split()
            # block (2 cells), Barrier, MPI, MPI_init, 4 methods, plain, persistent, vs init
            assert cells[:2] == [str(b), "B"] and len(cells) == 12, line
            assert (cells[4] == "n/a") != has_init and (cells[11] == "n/a") != has_init, line
            record = records[(8, 100).index(b)]
            assert cells[9] == f"{record['plain_speedup']:.2f}x", line
            assert cells[10] == f"{record['persistent_speedup']:.2f}x", line
        assert any(line.startswith("geomean speedup of best persistent plan over MPI:")
                   for line in lines)  # fmt: skip

    on_root(check)


def test_persistent_options():
    args = bench.parse_args(["alltoall", "--persistent"])
    assert args.persistent and args.orders == ["auto"]
    assert [(m.name, m.persistent) for m in args.methods] == [
        ("auto", False),
        ("auto_init", True),
    ]
    args = bench.parse_args(["allgather", "--persistent", "--orders", "morton", "--copy",
                             "auto,temporal"])  # fmt: skip
    assert [(m.name, m.order, m.copy, m.persistent) for m in args.methods] == [
        ("morton/auto", "morton", "auto", False),
        ("morton/auto_init", "morton", "auto", True),
        ("morton/temporal", "morton", "temporal", False),
        ("morton/temporal_init", "morton", "temporal", True),
    ]
    plain = bench.parse_args(["alltoall"])
    assert not plain.persistent and plain.orders == list(collectives.ALL_ORDERS)
    assert not any(m.persistent for m in plain.methods)
    assert bench.is_persistent("MPI_init") and not bench.is_persistent("MPI")


def test_plain_run_has_persistent_fields_unset(outdir):
    out = outdir / "plain.json"
    argv = ["alltoall", "--sizes", "8", "--orders", "auto"] + FAST + ["--json", str(out)]
    assert run_main(argv) == 0

    def check():
        document = read_json(out)
        assert {r["method"] for r in document["results"]} == {"MPI", "auto"}
        assert all(r["persistent"] is False and r["plan_order"] is None
                   for r in document["results"])  # fmt: skip
        assert document["persistent"] == [] and document["metadata"]["persistent"] is False
        assert document["metadata"]["geomean_speedup_persistent_small"] is None

    on_root(check)


class _EmulatedPrequest:
    """A persistent request made of the blocking collective: what an MPI-4 library gives."""

    def __init__(self, fn, sendbuf, recvbuf, freed: list) -> None:
        self.fn, self.sendbuf, self.recvbuf, self.freed = fn, sendbuf, recvbuf, freed

    def Start(self) -> None:
        self.fn(self.sendbuf, self.recvbuf)

    def Wait(self) -> None:
        pass

    def Free(self) -> None:
        self.freed.append(self)


def test_persistent_with_an_mpi4_library(outdir, monkeypatch):
    # Open MPI 4.1 has no MPI_Alltoall_init: emulate one, to see the MPI_init column filled.
    freed: list = []

    def emulated_init(comm, collective, sendbuf, recvbuf):
        fn = getattr(comm, collective.capitalize())
        return _EmulatedPrequest(fn, sendbuf, recvbuf, freed), None

    monkeypatch.setattr(collectives, "_mpi_persistent_init", emulated_init)
    out = outdir / "mpi4.json"
    argv = ["alltoall", "--sizes", "16,32", "--persistent", "--check"]
    assert run_main(argv + FAST + ["--json", str(out)]) == 0
    assert len(freed) == 3  # the probe's, then one per block size

    def check():
        document = read_json(out)
        methods = {r["method"] for r in document["results"]}
        assert methods == {"MPI", "MPI_init", "auto", "auto_init"}
        for rec in document["persistent"]:
            ratio = rec["mpi_persistent_us"] / rec["persistent_us"]
            assert rec["persistent_vs_mpi_persistent"] == pytest.approx(ratio)
        meta = document["metadata"]
        assert meta["mpi_persistent"] == "comm.Alltoall_init"
        assert meta["mpi_persistent_missing"] is None
        vs = [rec["persistent_vs_mpi_persistent"] for rec in document["persistent"]]
        assert meta["geomean_speedup_vs_mpi_persistent_small"] == pytest.approx(geometric_mean(vs))

    on_root(check)


def test_persistent_check_catches_a_wrong_plan(monkeypatch, capsys):
    class IdlePlan:  # leaves the receive buffer as it was
        order, copy = "row", "temporal"

        def __init__(self, comm, send, recv, **kwargs):
            self.recv, self.freed = recv, False

        def __call__(self):
            return self.recv

        def free(self):
            self.freed = True

    monkeypatch.setattr(zcoll, "alltoall_init", IdlePlan)
    argv = ["alltoall", "--sizes", "16", "--orders", "row", "--persistent", "--check"] + FAST
    assert run_main(argv) == 1
    err = capsys.readouterr().err
    if WORLD.rank == 0:
        assert "check failed" in err and "row_init" in err and "row," not in err, err


class _FakeComm:
    """Enough of a communicator for collectives._mpi_persistent_init: rank `rank` of `size`,
    whose peers report `peer_reasons`."""

    def __init__(self, rank, outcome, peer_reasons) -> None:
        self.rank, self.size, self.outcome, self.peers = (
            rank,
            1 + len(peer_reasons),
            outcome,
            peer_reasons,
        )

    def Alltoall_init(self, sendbuf, recvbuf):
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome

    def allgather(self, value):
        return [value, *self.peers]


def test_mpi_persistent_init_is_all_or_nothing():
    freed: list = []
    request = _EmulatedPrequest(None, None, None, freed)
    send = recv = np.zeros(2, np.uint8)
    # made everywhere
    got = collectives._mpi_persistent_init(_FakeComm(0, request, [None]), "alltoall", send, recv)
    assert got == (request, None) and not freed
    # missing everywhere: the same reason, no rank named
    missing = NotImplementedError()
    got = collectives._mpi_persistent_init(_FakeComm(0, missing, []), "alltoall", send, recv)
    assert got[0] is None and got[1].startswith("comm.Alltoall_init: NotImplementedError")
    assert "[rank" not in got[1]
    # made here but not on rank 1: freed here, and rank 1's reason given
    got = collectives._mpi_persistent_init(
        _FakeComm(0, request, ["comm.Alltoall_init: MPI.Exception: no"]), "alltoall", send, recv
    )
    assert got == (None, "comm.Alltoall_init: MPI.Exception: no [rank 1]") and freed == [request]


# --- cold-cache and budget helpers -------------------------------------------------------------


def test_measure_cold_counts_calls_and_flushes():
    calls = []
    flusher = common.CacheFlusher(WORLD)
    llc = zcoll.settings().llc_bytes
    ranks_here = WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    share = 2 * llc // ranks_here.size
    ranks_here.Free()
    assert flusher.nbytes >= share
    before = flusher.buffer[:4].copy()
    buffers = (np.arange(100, dtype=np.uint64), np.ones(7, np.uint8))
    seconds = common.measure_cold(lambda: calls.append(1), 4, 2, WORLD, buffers, flusher)
    assert len(calls) == 6 and seconds >= 0
    assert (flusher.buffer[:4] == before + 4).all()  # every byte written once per iteration
    # the checksum: 64-bit words summed, then the bytes of a tail shorter than a word
    assert common.touch(buffers) == sum(range(100)) + 7


@pytest.mark.parametrize(
    ("iterations", "budget", "per_iteration", "expected"),
    [(20, 1.0, 0.1, 10), (20, 0.01, 0.1, 5), (3, 0.01, 0.1, 3), (20, 0, 0.1, 20), (20, 9, 0.1, 20)],
)
def test_budget_cold_iterations(iterations, budget, per_iteration, expected):
    assert common.budget_cold_iterations(iterations, budget, per_iteration) == expected


# --- copy and fft ------------------------------------------------------------------------------


def test_copy_subcommand(outdir):
    files = {"json": outdir / "copy.json", "plot": outdir / "copy.png"}
    argv = ["copy", "--sizes", "4K,64K", "--iterations", "2", "--no-bound", "--no-progress"]
    assert run_main(argv + [f"--{k}={v}" for k, v in files.items()]) == 0

    def check():
        document = read_json(files["json"])
        rows = document["results"]
        kernels = {r["method"] for r in rows}
        assert {"copyto", "memcpy", "hybrid"} <= kernels
        phases = [1] if P == 1 else [1, P]
        expected = {(s, m, n) for s in (4096, 65536) for m in kernels for n in phases}
        assert {(r["size_bytes"], r["method"], r["ranks"]) for r in rows} == expected
        assert len(rows) == len(expected)
        assert all(r["gbps_aggregate"] > 0 and r["iterations"] == 2 for r in rows)
        assert document["metadata"]["benchmark"] == "copy"
        assert_png(files["plot"])

    on_root(check)


def test_crossover_subcommand(outdir):
    files = {"json": outdir / "x.json", "csv": outdir / "x.csv", "plot": outdir / "x.png"}
    argv = ["crossover", "--sizes", "4K,8K", "--fractions", "none", "--rounds", "2"]
    argv += ["--time-budget", "0.001", "--no-progress"]
    assert run_main(argv + [f"--{k}={v}" for k, v in files.items()]) == 0

    def check():
        document = read_json(files["json"])
        meta, rows, summary = document["metadata"], document["results"], document["summary"]
        assert meta["benchmark"] == "crossover" and meta["P"] == P and meta["rounds"] == 2
        methods = {"temporal", "streaming", "hybrid", "auto", "MPI"}
        expected = {(b, m) for b in (4096, 8192) for m in methods}
        assert {(r["block_bytes"], r["method"]) for r in rows} == expected
        assert len(rows) == len(expected)
        for r in rows:
            assert r["node_bytes"] == 2 * meta["node_size"] * P * r["block_bytes"]
            assert r["llc_fraction"] == pytest.approx(r["node_bytes"] / meta["llc_bytes"])
            assert 0 < r["min_us"] <= r["latency_us"] <= r["max_us"] and r["rounds"] == 2
        assert [s["block_bytes"] for s in summary] == [4096, 8192]
        for s in summary:
            assert s["best_fixed"] in ("temporal", "streaming", "hybrid")
            assert s["auto_vs_best"] > 0 and s["auto_vs_mpi"] > 0
            assert s["auto_copy"] == "temporal"  # far below half the LLC
        assert {(int(r["block_bytes"]), r["method"]) for r in read_csv(files["csv"])} == expected
        assert_png(files["plot"])

    on_root(check)


def test_crossover_block_sizes():
    llc = 32 * 1024 * 1024
    # P = 2 on one node: the node's data is 8 x block.
    sizes = crossover.block_sizes([64 * 1024, 4 * 1024 * 1024], [0.5, 0.75, 1.0], 2, 2, llc)
    assert sizes == [64 * 1024, 2 * 1024 * 1024, 3 * 1024 * 1024, 4 * 1024 * 1024]
    # Rounded down to 4 KiB, never below it.
    assert crossover.block_sizes([], [0.5], 1, 1, 1_000_000) == [249856]
    assert crossover.block_sizes([], [1e-9], 4, 4, llc) == [4096]


def test_crossover_compare():
    seconds = {
        "temporal": [1.0, 2.0, 1.0],
        "streaming": [3.0, 3.0, 3.0],
        "hybrid": [1.5, 0.9, 1.5],  # the fastest loop of all fixed modes
        "auto": [1.0, 1.0, 2.0],
        "MPI": [2.0, 2.0, 4.0],
    }
    verdict = crossover.compare(seconds)
    assert verdict.best_fixed == "hybrid"
    assert verdict.vs_best == pytest.approx(0.9) and verdict.vs_mpi == pytest.approx(2.0)
    assert verdict.vs_best_rounds == pytest.approx(0.9)  # per round: 1.5, 0.9, 0.75
    assert verdict.vs_mpi_rounds == pytest.approx(2.0)
    assert not verdict.meets()  # auto 0.9x the best fixed mode
    seconds["auto"] = [0.9, 1.0, 2.0]
    assert crossover.compare(seconds).meets()
    seconds["MPI"] = [1.3, 1.3, 1.3]  # auto only 1.44x MPI
    assert not crossover.compare(seconds).meets()


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("hide_mpi4py_fft", [False, True])
def test_fft_subcommand(hide_mpi4py_fft, rank, outdir, monkeypatch):
    if hide_mpi4py_fft:  # as where mpi4py-fft is not installed
        monkeypatch.setitem(sys.modules, "mpi4py_fft", None)
    try:
        import mpi4py_fft  # noqa: F401

        reference = True
    except ImportError:
        reference = False
    files = {"json": outdir / "fft.json", "plot": outdir / "fft.png"}
    argv = ["fft", "--sizes", "8", "--iterations", "2", "--check", "--no-progress"]
    argv += ["--mpi4py-fft-backend", "numpy", "--rank", str(rank)]  # no FFTW planning
    assert run_main(argv + [f"--{k}={v}" for k, v in files.items()]) == 0

    def check():
        document = read_json(files["json"])
        methods = [r["method"] for r in document["results"]]
        expected = ["zcoll", "mpi4py-fft"] if reference else ["zcoll"]
        expected += ["zcoll-fused", "zcoll-separate"] if rank else []
        assert methods == expected
        for key in ("geomean_fused_over_separate", "geomean_auto_over_best"):
            value = document["metadata"][key]
            assert (value is not None and value > 0) if rank else value is None
        for r in document["results"]:
            assert r["N"] == 8 and r["P"] == P and r["total_ms"] > 0 and r["iterations"] == 2
            assert r["rank"] == rank
        missing = document["metadata"]["mpi4py_fft_missing"]
        assert (missing is None) == reference, missing
        assert_png(files["plot"])

    on_root(check)


# --- setup: making and freeing communicators, PFFT plans, Pencils --------------------------------

SETUP_FAST = ["--iterations", "1", "--rounds", "2", "--no-progress"]
COMM_KINDS = ("Dup", "Split", "Create_cart")
STEP_FIELDS = {
    "comm": ("create_us", "first_call_us", "free_us"),
    "pfft": ("construct_us", "destroy_us"),
    "pencil": ("construct_us", "run_us", "destroy_us"),
}


def has_mpi4py_fft() -> bool:
    try:
        import mpi4py_fft  # noqa: F401
    except ImportError:
        return False
    return True


def test_setup_subcommand(outdir, capsys):
    files = {"json": outdir / "setup.json", "csv": outdir / "setup.csv"}
    argv = ["setup", "--quick", "--backends", "numpy", *SETUP_FAST]
    assert run_main(argv + [f"--{k}={v}" for k, v in files.items()]) == 0
    out = capsys.readouterr().out
    reference = has_mpi4py_fft()

    def check():
        document = read_json(files["json"])
        meta, rows = document["metadata"], document["results"]
        assert meta["benchmark"] == "setup" and meta["P"] == P and meta["quick"] is True
        assert meta["parts"] == ["comm", "pfft", "pencil"] and meta["backends"] == ["numpy"]
        assert (meta["iterations"], meta["rounds"]) == (1, 2)
        assert meta["leak_warnings"] == [], meta["leak_warnings"]
        assert (meta["mpi4py_fft_missing"] is None) == reference
        comm_rows = [r for r in rows if r["part"] == "comm"]
        assert {(r["case"], r["method"]) for r in comm_rows} == {
            (kind, method) for kind in COMM_KINDS for method in ("zcoll", "MPI")
        }
        assert len(comm_rows) == 2 * len(COMM_KINDS)
        pfft_rows = [r for r in rows if r["part"] == "pfft"]
        zcoll_cases = {r["case"] for r in pfft_rows if r["method"] == "zcoll"}
        assert 2 <= len(zcoll_cases) <= 5, zcoll_cases  # --quick: a handful
        others = {r["case"] for r in pfft_rows if r["method"] != "zcoll"}
        assert others <= zcoll_cases and (bool(others) or not reference)
        assert {r["method"] for r in pfft_rows} <= {"zcoll", "mpi4py-fft"}
        shapes = {"16x16x16", "12x13x14", "12x13x14x15"}  # test_mpifft's, as the options say
        for r in pfft_rows:
            assert r["backend"] == "numpy" and r["shape"] in shapes, r
            assert r["dtype"] in ("float32", "float64", "complex64", "complex128"), r
            assert r["decomposition"] in ("slab", "pencil") and r["padding"] in (None, 1.5), r
        pencil_rows = [r for r in rows if r["part"] == "pencil"]
        expected = ["zcoll", "mpi4py-fft"] if reference else ["zcoll"]
        assert [r["method"] for r in pencil_rows] == expected
        assert all(r["shape"] == "16x17x18" for r in pencil_rows)
        assert len(rows) == len(comm_rows) + len(pfft_rows) + len(pencil_rows)
        for r in rows:
            assert r["P"] == P and r["rounds"] == 2 and r["iterations"] == 1, r
            steps = [r[name] for name in STEP_FIELDS[r["part"]]]
            assert all(step >= 0 for step in steps) and r["total_us"] > 0, r
            assert 0 < r["best_total_us"] <= r["total_us"] * (1 + 1e-9), r
            assert r["total_us"] <= sum(steps) * (1 + 1e-9), r  # max of sums <= sum of maxima
        assert meta["dup_first_call_us"] > 0 and meta["fresh_first_call_max_case"] in COMM_KINDS
        if reference:
            assert meta["pfft_geomean_ratio"] > 0 and meta["pencil_ratio"] > 0
            assert meta["pfft_min_ratio"] <= meta["pfft_geomean_ratio"] * (1 + 1e-9)
        table = read_csv(files["csv"])
        assert [(r["part"], r["case"], r["method"]) for r in table] == [
            (r["part"], r["case"], r["method"]) for r in rows
        ]
        for line in ("# zcoll.bench setup |", "comm: first zcoll call on a fresh Dup",
                     "pencil: mpi4py-fft/zcoll", "no leaks:", "MPI library:"):  # fmt: skip
            assert line in out, f"{line!r} not in the output:\n{out}"

    on_root(check)


def test_setup_parts_alone_without_mpi4py_fft(outdir):
    files = {"json": outdir / "setup.json"}
    argv = ["setup", "--parts", "pencil", "--no-mpi4py-fft", *SETUP_FAST]
    assert run_main(argv + [f"--{k}={v}" for k, v in files.items()]) == 0

    def check():
        document = read_json(files["json"])
        meta, rows = document["metadata"], document["results"]
        assert meta["parts"] == ["pencil"] and "--no-mpi4py-fft" in meta["mpi4py_fft_missing"]
        assert [(r["part"], r["method"]) for r in rows] == [("pencil", "zcoll")]
        assert meta["pencil_ratio"] is None and "pfft_geomean_ratio" not in meta

    on_root(check)


def test_setup_pfft_configurations_span_test_mpifft():
    from zcoll.bench import setup

    configs = setup.pfft_configurations(["numpy", "fftw"])
    # 3 shapes x 4 dtypes x slab or pencil x padded or not, per backend
    assert len(configs) == len(set(configs)) == 2 * 3 * 4 * 2 * 2
    assert {c.shape for c in configs} == {(16, 16, 16), (12, 13, 14), (12, 13, 14, 15)}
    assert {c.padding for c in configs} == {0.0, 1.5}
    slab = next(c for c in configs if c.decomposition == "slab" and c.padding)
    assert slab.kwargs()["slab"] is True
    assert slab.kwargs()["padding"] == [1.5] * len(slab.shape)
    assert slab.kwargs()["padding"] is not slab.kwargs()["padding"]  # fresh for every call
    pencil = next(c for c in configs if c.decomposition == "pencil" and not c.padding)
    assert "slab" not in pencil.kwargs() and pencil.kwargs()["padding"] is False
    quick = setup.pfft_configurations(["fftw", "numpy"], quick=True)
    assert quick and all(c.backend == "fftw" for c in quick)


def test_setup_warns_of_a_leak(outdir, monkeypatch):
    """A Subcomm left undestroyed each iteration leaves zcoll contexts open: a warning. (Its
    transfer runs through zcoll from the first run, so that it has a context to leave open:
    by default a Pencil step's runs go through MPI, tests/fft/test_mpi_runs.py.)"""
    from zcoll import _core
    from zcoll.fft import pencil

    if MPI.COMM_WORLD.size == 1:
        pytest.skip("a one-rank transfer is a copy and opens no context (_mpi_runs.py)")
    kept = []
    monkeypatch.setattr(pencil.Subcomm, "destroy", lambda self: kept.append(self))
    monkeypatch.setattr(_core, "cold_transfer_runs", lambda bytes_per_rank: 0)
    files = {"json": outdir / "setup.json"}
    argv = ["setup", "--parts", "pencil", "--no-mpi4py-fft", "--warmup", "0", *SETUP_FAST]
    try:
        assert run_main(argv + [f"--{k}={v}" for k, v in files.items()]) == 0
    finally:
        monkeypatch.undo()
        for subcomm in kept:
            subcomm.destroy()
    assert kept

    def check():
        warnings = read_json(files["json"])["metadata"]["leak_warnings"]
        assert any("context" in w and "still open" in w for w in warnings), warnings

    on_root(check)


# --- alltoallv, allgatherv, neighbourhood collectives ------------------------------------------

VCOLLECTIVES = [
    "alltoallv",
    "allgatherv",
    "neighbor_alltoall",
    "neighbor_allgather",
    "neighbor_alltoallv",
    "neighbor_allgatherv",
]
NEIGHBORHOOD = {name for name in VCOLLECTIVES if name.startswith("neighbor_")}


def grid(ndims: int) -> str:
    """The periodic grid the neighbourhood benches run on, as ``--topology 2d/3d`` says."""
    return "x".join(map(str, MPI.Compute_dims(P, ndims)))


@pytest.mark.parametrize("collective", VCOLLECTIVES)
def test_vcollective_json_csv_plot(collective, outdir, capsys):
    """Uneven counts (the defaults: 0.5-1.5 x block, some zeros), checked against mpi4py."""
    files = {k: outdir / f"v.{k}" for k in ("json", "csv")} | {"plot": outdir / "v.png"}
    argv = [collective, "--sizes", "8,100,20K", "--orders", "row,morton,auto", "--check"]
    argv += FAST + [f"--{k}={v}" for k, v in files.items()]
    assert run_main(argv) == 0
    out = capsys.readouterr().out
    methods = ("MPI", "row", "morton", "auto")
    expected = {(b, m) for b in (8, 100, 20480) for m in methods}
    topology = grid(2) if collective in NEIGHBORHOOD else None

    def check():
        document = read_json(files["json"])
        rows = document["results"]
        assert {(r["block_bytes"], r["method"]) for r in rows} == expected
        assert len(rows) == len(expected)
        for r in rows:
            assert r["collective"] == collective and r["P"] == P and r["topology"] == topology
            assert r["latency_us"] > 0 and r["iterations"] == 3 and r["warmup"] == 1
            assert r["order"] == (None if r["method"] == "MPI" else r["method"])
            assert r["received_bytes"] >= 0
        meta = document["metadata"]
        assert meta["collective"] == collective and meta["P"] == P and meta["checked"]
        assert meta["topology"] == topology and meta["orders"] == ["row", "morton", "auto"]
        for key in ("speedup_small", "speedup_large", "auto_speedup_small", "auto_speedup_large"):
            assert meta[f"geomean_{key}"] > 0, key
        table = read_csv(files["csv"])
        assert {(int(r["block_bytes"]), r["method"]) for r in table} == expected
        assert_png(files["plot"])
        assert f"comm.{collective.capitalize()}" in out and "geomean speedup" in out

    on_root(check)


@pytest.mark.parametrize("collective", VCOLLECTIVES)
def test_vcollective_even_counts_3d(collective, outdir):
    """With --spread 1,1 --zeros 0 every block has the nominal size: the bytes received are
    known; the neighbourhood collectives on a 3D grid (6 neighbours)."""
    out = outdir / "even.json"
    argv = [collective, "--sizes", "64", "--orders", "hilbert", "--spread", "1,1", "--zeros", "0"]
    argv += ["--topology", "3d", "--check", "--json", str(out)] + FAST
    assert run_main(argv) == 0
    per_rank = 6 * 64 if collective in NEIGHBORHOOD else P * 64

    def check():
        document = read_json(out)
        assert {r["method"] for r in document["results"]} == {"MPI", "hilbert"}
        for r in document["results"]:
            assert r["received_bytes"] == P * per_rank
            assert r["topology"] == (grid(3) if collective in NEIGHBORHOOD else None)
        assert document["metadata"]["spread"] == (
            None if collective in ("neighbor_alltoall", "neighbor_allgather") else [1.0, 1.0]
        )

    on_root(check)


def test_vcollective_counts_are_seeded_and_bounded():
    counts = vcollectives.draw_counts(100, (P, P), spread=(0.5, 1.5), zeros=0.25, seed=7)
    all_ranks_agree(WORLD, WORLD.bcast(counts, root=0).tolist() == counts.tolist(), "seeded")
    nonzero = counts[counts > 0]
    assert ((nonzero >= 50) & (nonzero <= 150)).all()
    many = vcollectives.draw_counts(100, 10_000, zeros=0.25, seed=7)
    assert 0.2 < np.mean(many == 0) < 0.3
    assert 90 < many[many > 0].mean() < 110
    assert (vcollectives.draw_counts(8, 50, spread=(1, 1), zeros=0) == 8).all()
    assert not (vcollectives.draw_counts(64, 50) == vcollectives.draw_counts(128, 50)).all()


@pytest.mark.parametrize("collective", ["alltoallv", "neighbor_allgatherv"])
def test_vcollective_check_failure_returns_1_everywhere(collective, monkeypatch, capsys):
    def wrong(comm, send, recv, **kwargs):  # leaves the receive buffer as it was
        return recv[0]

    monkeypatch.setattr(zcoll, collective, wrong)
    argv = [collective, "--sizes", "16", "--orders", "column", "--zeros", "0", "--check"] + FAST
    assert run_main(argv) == 1
    err = capsys.readouterr().err
    if WORLD.rank == 0:
        assert "check failed" in err and "column" in err, err


# --- usage errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["nosuch"],
        ["alltoall", "--sizes", "0"],
        ["alltoall", "--sizes", "8", "--min", "8"],
        ["alltoall", "--orders", "zigzag"],
        ["alltoall", "--copy", "auto,fast"],
        ["alltoall", "--method", "lukewarm"],
        ["allgather", "--iterations", "0"],
        ["alltoall", "--plot", "out.pdf"],
        ["fft", "--grid", "2x2x2x2"],
        ["copy", "--time-budget", "0"],
        ["crossover", "--rounds", "0"],
        ["crossover", "--fractions", "0.5,-1"],
        ["crossover", "--time-budget", "0"],
        ["alltoallv", "--zeros", "2"],
        ["allgatherv", "--spread", "1.5,0.5"],
        ["neighbor_alltoall", "--topology", "cube"],
        ["neighbor_alltoallv", "--topology", f"{P + 1}x1"],
        ["setup", "--parts", "comm,plans"],
        ["setup", "--backends", "mkl"],
        ["setup", "--rounds", "0"],
        ["setup", "--plot", "setup.png"],
    ],
)
def test_usage_errors(argv, capsys):
    assert run_main(argv) == 2
    err = capsys.readouterr().err
    printed = WORLD.gather(bool(err.strip()), root=0)
    if WORLD.rank == 0:
        assert printed[0] and "usage:" in err, err
        assert not any(printed[1:]), "only rank 0 prints usage errors"


# --- reporting ---------------------------------------------------------------------------------


def _document(collective: str = "alltoall") -> dict:
    rows = [
        {"collective": collective, "P": 2, "block_bytes": b, "method": m, "latency_us": t}
        for b, t in ((8, 1.0), (1024, 4.0))
        for m, t in (("MPI", 2 * t), ("row", t), ("morton", 1.5 * t))
    ]
    metadata = {"collective": collective, "P": 2, "host": "h", "date": "2026-01-01T00:00:00"}
    return {"metadata": metadata, "results": rows}


def test_plot_results_draws_one_line_per_method():
    def check():  # on rank 0 alone: the only rank that ever imports matplotlib in a run
        from matplotlib.figure import Figure

        ax = Figure().add_subplot()
        assert bench.plot_results(_document(), ax=ax) is ax
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert set(lines) == {"MPI", "row", "morton"}
        assert lines["MPI"].get_linestyle() == "--" and lines["row"].get_linestyle() == "-"
        assert list(lines["row"].get_xdata()) == [8, 1024]
        assert list(lines["MPI"].get_ydata()) == [2.0, 8.0]
        assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
        assert "alltoall" in ax.get_title() and "P=2" in ax.get_title()

    on_root(check)


def test_plot_draws_persistent_methods_beside_their_twins():
    def check():
        from matplotlib.figure import Figure

        document = _document()
        for row in list(document["results"]):
            if row["method"] in ("MPI", "row"):
                twin = dict(row, method=row["method"] + "_init", latency_us=row["latency_us"] / 2)
                document["results"].append(twin)
        ax = Figure().add_subplot()
        bench.plot_results(document, ax=ax)
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert set(lines) == {"MPI", "row", "morton", "MPI_init", "row_init"}
        for name in ("MPI", "row"):
            plain, plan = lines[name], lines[name + "_init"]
            assert plan.get_linestyle() == "-." and plan.get_marker() == "x"
            assert plan.get_color() == plain.get_color()
        assert lines["row"].get_color() != lines["morton"].get_color()
        assert lines["MPI"].get_linestyle() == "--" and lines["row"].get_linestyle() == "-"

    on_root(check)


def test_plot_rejects_unknown_documents():
    with pytest.raises(ValueError, match="not a zcoll.bench JSON document"):
        plotting.plot_results({"metadata": {}, "results": []})


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_only_on_a_terminal(monkeypatch):
    pytest.importorskip("tqdm")
    terminal = _Terminal()
    monkeypatch.setattr(_timing, "_progress_stream", lambda: terminal)
    report = common.Reporter(WORLD, progress=True)
    report.start(2, "sweep")
    assert (report.bar is not None) == (WORLD.rank == 0)
    report.step("one")
    report.close()
    assert report.bar is None
    assert ("sweep" in terminal.getvalue()) == (WORLD.rank == 0)
    disabled = common.Reporter(WORLD, progress=False)
    disabled.start(2, "sweep")
    assert disabled.bar is None


def test_progress_without_tqdm(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setattr(_timing, "_progress_stream", lambda: _Terminal())
    report = common.Reporter(WORLD, progress=True)
    report.start(3, "sweep")
    assert report.bar is None
    report("a line")
    report.step()
    report.close()
    out = capsys.readouterr().out
    all_ranks_agree(WORLD, ("a line" in out) == (WORLD.rank == 0), f"printed {out!r}")


def test_check_failure_returns_1_everywhere(monkeypatch, capsys):
    def wrong_alltoall(comm, send, recv, **kwargs):  # leaves the receive buffer as it was
        return recv

    monkeypatch.setattr(zcoll, "alltoall", wrong_alltoall)
    argv = ["alltoall", "--sizes", "16", "--orders", "column", "--check"] + FAST
    assert run_main(argv) == 1
    err = capsys.readouterr().err
    if WORLD.rank == 0:
        assert "check failed" in err and "column" in err, err
