"""zcoll_replay and python -m zcoll.bench cachemiss: the one-process schedule replay and its misses.

Also the neighbourhood collective on periodic Cartesian grids (--op neighbor_alltoall --grid):
the engine's 4-tuples, their order and each rank's piece, through the engine's copy loop.

The tool needs no MPI, so these tests run once, in the P = 1 run of the suite. The replay's
--verify mode checks every received byte against a pattern of (source, destination, offset);
the simulated misses are checked against line counts worked out here from the buffer layout
(send and receive buffers 64-byte aligned, 64-byte lines), not taken from the code under test.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys

import pytest
from mpi4py import MPI

import zcoll
from helpers import launcher_free_env
from zcoll import bench
from zcoll.bench import cachemiss
from zcoll.bench.cachemiss import CacheGeometry, Config

pytestmark = pytest.mark.skipif(
    MPI.COMM_WORLD.size != 1, reason="one-process tool: tested in the P = 1 run only"
)
needs_valgrind = pytest.mark.skipif(
    shutil.which("valgrind") is None, reason="valgrind not installed (apt-get install valgrind)"
)

LINE = 64
L1 = CacheGeometry(32768, 8, LINE)
L2 = CacheGeometry(262144, 8, LINE)
# Lines a segment touches besides the blocks: its slice of the schedule, the tables of buffer
# addresses and ranks, the stack, memcpy's dispatch data.
METADATA_LINES = 24


def replay(*args: str) -> subprocess.CompletedProcess:
    exe = str(cachemiss.replay_binary())
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in_place"])
@pytest.mark.parametrize("order", cachemiss.ORDERS)
@pytest.mark.parametrize("op", cachemiss.OPS)
def test_replay_delivers_every_block(op, order, in_place):
    for p in (1, 2, 3, 5, 6, 8, 16):
        for block in (1, 24, 64):
            args = ["--op", op, "--order", order, "--p", str(p), "--block", str(block)]
            args += ["--verify", "--evict-bytes", "4096", "--skew", str(64 * (p % 3))]
            args += ["--in-place"] if in_place else []
            r = replay(*args)
            assert r.returncode == 0, f"{args}: {r.stderr}"
            assert "verify=ok" in r.stdout


@pytest.mark.parametrize("op", cachemiss.OPS)
def test_verify_catches_a_missing_segment(op):
    r = replay("--op", op, "--order", "hilbert", "--p", "6", "--block", "16", "--verify")
    assert r.returncode == 0
    r = replay(
        "--op", op, "--order", "hilbert", "--p", "6", "--block", "16", "--verify",
        "--skip-rank", "2",
    )  # fmt: skip
    assert r.returncode == 1
    assert "verify=FAILED" in r.stdout and "differs at byte" in r.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "--op is required"),
        (["--op", "bcast", "--p", "2", "--block", "8"], "unknown --op"),
        (["--op", "alltoall", "--p", "0", "--block", "8"], "--p must be"),
        (["--op", "alltoall", "--p", "x", "--block", "8"], "non-negative integer"),
        (["--op", "alltoall", "--p", "4", "--block", "0"], "--block must be"),
        (["--op", "alltoall", "--p", "4", "--block", "8", "--order", "zig"], "unknown --order"),
        (["--op", "alltoall", "--p", "4", "--block", "8", "--warm", "hot"], "--warm"),
        (["--op", "alltoall", "--p", "4", "--block", "8", "--frob"], "unknown argument"),
        (["--op", "alltoall", "--p", "4", "--block", "8", "--skew", "10"], "multiple of 64"),
        (["--op", "neighbor_alltoall", "--block", "8"], "needs --grid"),
        (["--op", "neighbor_alltoall", "--grid", "8x0", "--block", "8"], "--grid dimensions"),
        (["--op", "neighbor_alltoall", "--grid", "8xq", "--block", "8"], "non-negative integer"),
        (["--op", "neighbor_alltoall", "--grid", "4x4", "--p", "8", "--block", "8"], "--p differs"),
        (["--op", "neighbor_alltoall", "--grid", "4x4", "--block", "8", "--in-place"], "in-place"),
        (["--op", "neighbor_alltoall", "--grid", "4", "--block", "8", "--metadata", "x"], "warm"),
        (["--op", "alltoall", "--p", "4", "--block", "8", "--grid", "2x2"], "--grid goes with"),
        (["--op", "alltoall", "--p", "4", "--block", "8", "--metadata", "cold"], "--metadata goes"),
        (["--op", "neighbor_allgather", "--grid", "4x4", "--block", "8"], "unknown --op"),
    ],
)
def test_replay_rejects_bad_arguments(args, message):
    r = replay(*args)
    assert r.returncode == 2
    assert message in r.stderr and "usage:" in r.stderr


# --- neighbourhood collectives on periodic Cartesian grids -------------------------------------

GRIDS = ("8x8", "3x5", "5x3", "2x2", "2x1", "1x1", "1x7", "7", "2x2x2", "4x3x2", "3x1x2")


@pytest.mark.parametrize("order", [*cachemiss.ORDERS, "auto"])
def test_neighbourhood_replay_delivers_every_block(order):
    # Periodic dimensions of 1 and 2 ranks: both neighbours are one rank (itself, or the other
    # one), told apart by the direction of travel; --verify checks each block's (sender, tag).
    for grid in GRIDS:
        p = math.prod(int(d) for d in grid.split("x"))
        for block in (1, 24, 64, 100):
            args = ["--op", "neighbor_alltoall", "--grid", grid, "--order", order]
            args += ["--block", str(block), "--verify", "--evict-bytes", "4096"]
            args += ["--skew", str(64 * (block % 3))]
            r = replay(*args)
            assert r.returncode == 0, f"{args}: {r.stderr}"
            assert "verify=ok" in r.stdout, r.stdout
            assert f"p={p} " in r.stdout and f"tuples={2 * grid.count('x') * p + 2 * p}" in r.stdout


def test_neighbourhood_verify_catches_a_missing_piece():
    for order in ("row", "morton"):
        args = ["--op", "neighbor_alltoall", "--grid", "4x3", "--order", order, "--block", "16"]
        assert replay(*args, "--verify").returncode == 0
        r = replay(*args, "--verify", "--skip-rank", "5")
        assert r.returncode == 1, order
        assert "verify=FAILED" in r.stdout and "differs at byte" in r.stderr


def test_grid_parsing():
    assert cachemiss.parse_grid("8x8") == (8, 8)
    assert cachemiss.parse_grid("4X3x2") == (4, 3, 2)
    assert cachemiss.format_grid((4, 3, 2)) == "4x3x2"
    for bad in ("8x", "0x4", "axb", ""):
        with pytest.raises(ValueError, match="AxB"):
            cachemiss.parse_grid(bad)


def test_neighbourhood_replay_command(monkeypatch):
    monkeypatch.setattr(cachemiss, "valgrind_binary", lambda: "valgrind")
    cmd = cachemiss.replay_command(
        Config("neighbor_alltoall", 64, 512, "morton", (8, 8)), L1, L2, "out", metadata="cold"
    )
    assert "--toggle-collect=zcoll_replay_tuples" in cmd and "--p" not in cmd
    assert cmd[cmd.index("--grid") + 1] == "8x8" and cmd[cmd.index("--metadata") + 1] == "cold"
    cmd = cachemiss.replay_command(Config("alltoall", 16, 8, "row"), L1, L2, "out")
    assert "--toggle-collect=zcoll_replay_segment" in cmd and "--grid" not in cmd
    assert "--metadata" not in cmd and cmd[cmd.index("--p") + 1] == "16"
    # The records of alltoall and allgather are unchanged: no grid field.
    m = cachemiss.Measurement(Config("alltoall", 16, 8, "row"), 1, 2, 3, 4, 5)
    assert "grid" not in m.row()
    m = cachemiss.Measurement(Config("neighbor_alltoall", 12, 8, "row", (3, 2, 2)), 1, 2, 3, 4, 5)
    assert m.row()["grid"] == "3x2x2" and m.row()["p"] == 12


CALLGRIND_SAMPLE = """\
# callgrind format
version: 1
creator: callgrind-3.19.0
pid: 4242
cmd:  zcoll_replay --op alltoall
part: 1

desc: I1 cache: 32768 B, 64 B, 8-way associative
desc: D1 cache: 32768 B, 64 B, 8-way associative
desc: LL cache: 524288 B, 64 B, 8-way associative

positions: line
events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw
summary: 12723 4355 1880 19 467 87 19 466 86

ob=(1) /usr/lib/zcoll/bin/zcoll_replay
fl=(1) ???
fn=(1) zcoll_replay_segment
0 40 10 8 2 1 1 2 1 1

totals: 12723 4355 1880 19 467 87 19 466 86
"""

CACHEGRIND_SAMPLE = """\
desc: D1 cache:         32768 B, 64 B, 8-way associative
cmd: ./a.out
events: Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw
fl=???
fn=main
0 10 1 1 4 2 2 3 1
summary: 10 1 1 4 2 2 3
"""


def test_parse_event_totals(tmp_path):
    f = tmp_path / "callgrind.out"
    f.write_text(CALLGRIND_SAMPLE)
    ev = cachemiss.parse_event_totals(f)
    assert ev == {
        "Ir": 12723, "Dr": 4355, "Dw": 1880, "I1mr": 19, "D1mr": 467, "D1mw": 87, "ILmr": 19,
        "DLmr": 466, "DLmw": 86,
    }  # fmt: skip
    f.write_text(CACHEGRIND_SAMPLE)  # no totals: line; trailing zero counts omitted
    ev = cachemiss.parse_event_totals(f)
    assert [ev[k] for k in ("Dr", "D1mr", "DLmr", "Dw", "D1mw", "DLmw")] == [4, 2, 2, 3, 0, 0]
    f.write_text("events: Ir Dr\n")
    with pytest.raises(ValueError, match="no 'events:'"):
        cachemiss.parse_event_totals(f)
    f.write_text("events: Ir\nsummary: 1 2\n")
    with pytest.raises(ValueError, match="2 counts for 1 events"):
        cachemiss.parse_event_totals(f)


def test_cache_geometry():
    assert CacheGeometry.parse("32768,8,64") == CacheGeometry(32768, 8, 64)
    assert str(CacheGeometry(524288, 8, 64)) == "512 KiB 8-way 64 B lines"
    with pytest.raises(ValueError, match="power-of-two number of sets"):
        CacheGeometry.parse("49152,8,64")  # 96 sets
    with pytest.raises(ValueError, match="SIZE,ASSOC,LINE"):
        CacheGeometry.parse("32k,8")


def test_host_geometry_from_sysfs(tmp_path):
    caches = {
        "index0": ("1", "Data", "48K", "12", "64"),
        "index1": ("1", "Instruction", "32K", "8", "64"),
        "index2": ("2", "Unified", "2048K", "16", "64"),
        "index3": ("3", "Unified", "32768K", "16", "64"),
    }
    names = ("level", "type", "size", "ways_of_associativity", "coherency_line_size")
    for index, values in caches.items():
        (tmp_path / index).mkdir()
        for name, value in zip(names, values):
            (tmp_path / index / name).write_text(value + "\n")
    l1, l2 = cachemiss.host_geometry(tmp_path)
    assert l1 == CacheGeometry(48 * 1024, 12, 64)
    assert l2 == CacheGeometry(2048 * 1024, 16, 64)
    with pytest.raises(RuntimeError, match="--d1 and --ll"):
        cachemiss.host_geometry(tmp_path / "missing")


def test_missing_valgrind_is_explained(monkeypatch, capsys):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert cachemiss.main(["--quick"]) == 2
    assert "apt-get install valgrind" in capsys.readouterr().err


def lines_of(nbytes: int) -> int:
    return math.ceil(nbytes / LINE)


def buffer_lines(op: str, p: int, block: int) -> int:
    """Cache lines of one rank's send and receive buffers (each starts on a line)."""
    send = p * block if op == "alltoall" else block
    return lines_of(send) + lines_of(p * block)


@needs_valgrind
@pytest.mark.parametrize("op", cachemiss.OPS)
def test_misses_of_8_byte_blocks_at_16_ranks(op):
    # Row: rank d reads one 8-byte block from each of the 16 send buffers (16 lines) and writes
    # its own 128-byte receive row (2 lines). Morton: a 4 x 4 square of the block matrix, that
    # is 4 aligned 32-byte runs read (4 lines) and 4 written (4 lines).
    p, block = 16, 8
    expected = {"row": p + lines_of(p * block), "morton": 4 + 4}
    got = {}
    for order, lines in expected.items():
        m = cachemiss.run_config(Config(op, p, block, order), L1, L2)
        got[order] = m.d1_per_rank
        assert lines <= m.d1_per_rank <= lines + METADATA_LINES, (order, m)
        assert m.ll_per_rank <= m.d1_per_rank  # L2 is inclusive of what L1 missed
        assert m.data_refs >= 2 * p * block / 8  # at least one 8-byte load and store a block
    assert got["morton"] < got["row"]


@needs_valgrind
def test_neighbourhood_misses_of_64_byte_blocks():
    # Every rank of a 4 x 4 torus receives 4 blocks; 64-byte blocks fill their lines, and every
    # order's piece is 4 whole blocks (cuts at 256-byte multiples): 4 lines read, 4 written.
    # Before its piece each rank reads the tuples' metadata, as the engine does; without that
    # (cold) its walk through the tuples up to its piece misses as well.
    data_lines = 4 + 4
    got = {}
    for order in cachemiss.ORDERS:
        config = Config("neighbor_alltoall", 16, 64, order, (4, 4))
        m = cachemiss.run_config(config, L1, L2)
        got[order] = m.d1_per_rank
        assert data_lines <= m.d1_per_rank <= data_lines + METADATA_LINES, (order, m)
        assert m.ll_per_rank <= m.d1_per_rank
        assert m.data_refs >= 2 * 4 * 64 / 8 * 16
    assert max(got.values()) - min(got.values()) <= 2, got
    cold = cachemiss.run_config(Config("neighbor_alltoall", 16, 64, "row", (4, 4)), L1, L2,
                                metadata="cold")  # fmt: skip
    assert cold.d1_per_rank > got["row"] + 4, (cold, got)


@needs_valgrind
def test_cli_neighbourhood(tmp_path, capsys):
    out = tmp_path / "grid.json"
    csv_file = tmp_path / "grid.csv"
    argv = ["--collective", "neighbor_alltoall", "--grid", "4x4,2x3x2", "--blocks", "8,64"]
    argv += ["--orders", "row,morton", "--cache", "paper", "--no-progress"]
    assert cachemiss.main([*argv, "--json", str(out), "--csv", str(csv_file)]) == 0
    printed = capsys.readouterr().out
    assert "neighbor_alltoall, grid 4x4 (P = 16)" in printed and "m/row" in printed
    assert "neighbor_alltoall, grid 2x3x2 (P = 12)" in printed and "metadata=warm" in printed
    assert "alltoall, P =" not in printed and "target" not in printed
    data = json.loads(out.read_text())
    assert data["caches"]["metadata"] == "warm"
    rows = data["results"]
    assert {(x["op"], x["grid"], x["p"], x["block"], x["order"]) for x in rows} == {
        ("neighbor_alltoall", g, p, b, o)
        for g, p in (("4x4", 16), ("2x3x2", 12))
        for b in (8, 64)
        for o in ("row", "morton")
    }
    for x in rows:  # every rank receives 2 * dims blocks and sends as many
        assert x["d1_per_rank"] >= 2 * lines_of(2 * x["grid"].count("x") * x["block"] + x["block"])
    assert len(csv_file.read_text().splitlines()) == len(rows) + 1
    # --grid alone means the neighbourhood collective; with the others, one table each.
    assert bench.main(["cachemiss", "--grid", "2x2", "--blocks", "8", "--no-progress"]) == 0
    assert "neighbor_alltoall, grid 2x2 (P = 4)" in capsys.readouterr().out
    argv = ["cachemiss", "--ops", "alltoall,neighbor_alltoall", "--procs", "4", "--blocks", "8"]
    assert bench.main([*argv, "--orders", "row", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "alltoall, P = 4" in printed and "neighbor_alltoall, grid 8x8 (P = 64)" in printed


@needs_valgrind
def test_cli_quick(tmp_path, capsys):
    # In process: a Python child of an mpiexec-launched rank cannot initialise MPI on its own.
    out = tmp_path / "quick.json"
    csv_file = tmp_path / "quick.csv"
    argv = ["--quick", "--cache", "paper", "--json", str(out), "--csv", str(csv_file)]
    assert cachemiss.main([*argv, "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "m/row" in printed and "alltoall, P = 16" in printed and "allgather, P = 16" in printed
    data = json.loads(out.read_text())
    assert data["caches"]["d1"] == {"size": 32768, "assoc": 8, "line": 64}
    rows = data["results"]
    expected = {(op, 16, b, o) for op in cachemiss.OPS for b in (8, 512) for o in ("row", "morton")}
    assert {(x["op"], x["p"], x["block"], x["order"]) for x in rows} == expected
    for x in rows:
        # Each rank starts cold and every line of every buffer is copied from or to once.
        assert x["d1_per_rank"] >= buffer_lines(x["op"], x["p"], x["block"]), x
        assert x["d1_read"] + x["d1_write"] == pytest.approx(x["d1_per_rank"] * x["p"])
    assert len(csv_file.read_text().splitlines()) == len(rows) + 1


@needs_valgrind
def test_cli_rejects_bad_options(capsys):
    with pytest.raises(SystemExit):
        cachemiss.main(["--orders", "row,zigzag"])
    assert "unknown ['zigzag']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cachemiss.main(["--d1", "49152,8,64"])
    assert "power-of-two" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cachemiss.main(["--skew", "100"])
    assert "multiple of 64" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cachemiss.main(["--collective", "alltoall", "--grid", "8x8"])
    assert "--grid goes with --collective neighbor_alltoall" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cachemiss.main(["--grid", "8xq"])
    assert "AxB or AxBxC" in capsys.readouterr().err


# --- python -m zcoll.bench cachemiss ----------------------------------------------------------


def test_bench_subcommand_explains_missing_valgrind(monkeypatch, capsys):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert bench.main(["cachemiss", "--quick"]) == 2
    assert "apt-get install valgrind" in capsys.readouterr().err


def test_bench_subcommand_rejects_bad_options(capsys):
    assert bench.main(["cachemiss", "--skew", "100"]) == 2
    assert "multiple of 64" in capsys.readouterr().err
    assert bench.main(["cachemiss", "--orders", "row,zigzag"]) == 2
    assert "unknown ['zigzag']" in capsys.readouterr().err


def test_bench_subcommand_help_lists_the_options(capsys):
    assert bench.main(["cachemiss", "--help"]) == 0
    out = capsys.readouterr().out
    for option in ("--quick", "--procs", "--blocks", "--orders", "--cache", "--warm", "--skew",
                   "--collective", "--grid", "--metadata"):  # fmt: skip
        assert option in out, option
    assert bench.main(["--help"]) == 0
    assert "cachemiss" in capsys.readouterr().out


def test_replay_override(monkeypatch, tmp_path):
    monkeypatch.setenv("ZCOLL_REPLAY", str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="ZCOLL_REPLAY=.*missing is not an executable"):
        cachemiss.replay_binary()
    monkeypatch.setenv("ZCOLL_REPLAY", "")
    assert cachemiss.replay_binary().name == "zcoll_replay"


@needs_valgrind
def test_bench_subcommand_quick(tmp_path, capsys):
    out = tmp_path / "quick.json"
    argv = ["cachemiss", "--quick", "--cache", "paper", "--no-progress", "--json", str(out)]
    assert bench.main(argv) == 0
    assert "alltoall, P = 16" in capsys.readouterr().out
    rows = json.loads(out.read_text())["results"]
    assert {(x["op"], x["order"]) for x in rows} == {
        (op, o) for op in cachemiss.OPS for o in ("row", "morton")
    }


# --- --topology: order numa on a described NUMA machine, cross-domain bytes -------------------

# 2 NUMA domains of 3 PUs. (On 2 domains of 4, Morton's segments at P = 8 happen to stay in
# their domain's rows; at P = 6 on 2 of 3 as well.)
TWO_SOCKETS = "package:2 numa:1 core:3 pu:1"


@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in_place"])
@pytest.mark.parametrize("op", cachemiss.OPS)
def test_numa_replay_delivers_every_block(op, in_place):
    layouts = [[0, 0, 1, 1], [0, 0, 0, 1, 1, 1, 1, 1], [3, 1, 3, 0, 2, 2, 1], [0, 1], [4, 4, 4]]
    for numa in layouts:
        args = ["--op", op, "--order", "numa", "--p", str(len(numa)), "--block", "24"]
        args += ["--numa", ",".join(map(str, numa)), "--verify", "--evict-bytes", "4096"]
        args += ["--in-place"] if in_place else []
        r = replay(*args)
        assert r.returncode == 0, f"{args}: {r.stderr}"
        assert "verify=ok" in r.stdout
    r = replay("--op", op, "--order", "numa", "--p", "4", "--block", "8", "--numa", "0,1")
    assert r.returncode == 2 and "--numa gives the NUMA node of each" in r.stderr


def independent_cross_writes(p: int, order: str, numa: list[int], block: int) -> int:
    """Bytes written into another domain's buffers: the block (d, s) that rank e copies lands in
    rank d's receive buffer, in d's domain."""
    s = zcoll.schedule(p, order, numa_nodes=numa)
    return sum(block for e in range(p) for d, _ in s.segment(e).tolist() if numa[d] != numa[e])


@pytest.mark.parametrize("p", [4, 8, 12, 16, 24])
def test_numa_writes_less_across_domains_than_morton(p):
    numa = list(cachemiss.placed_numa_nodes(TWO_SOCKETS, p))
    assert numa == [i % 6 // 3 for i in range(p)]
    writes = {}
    for order in ("morton", "numa"):
        config = Config("alltoall", p, 64, order, numa=tuple(numa))
        read, write = cachemiss.cross_domain_bytes(config)
        writes[order] = independent_cross_writes(p, order, numa, 64)
        assert write == writes[order]
        assert read > 0  # half the blocks come from the other socket, whoever copies them
    assert writes["numa"] == 0 < writes["morton"]


@needs_valgrind
def test_cli_topology_reports_cross_domain_bytes(tmp_path, capsys):
    out = tmp_path / "numa.json"
    argv = ["--topology", TWO_SOCKETS, "--ops", "alltoall", "--procs", "8", "--blocks", "64"]
    argv += ["--orders", "morton,numa", "--cache", "paper", "--json", str(out), "--no-progress"]
    assert cachemiss.main(argv) == 0
    printed = capsys.readouterr().out
    assert "alltoall, P = 8 on 2 NUMA domains: bytes per rank in another domain" in printed
    rows = {x["order"]: x for x in json.loads(out.read_text())["results"]}
    numa = [i % 6 // 3 for i in range(8)]
    for order, row in rows.items():
        assert row["cross_write"] == independent_cross_writes(8, order, numa, 64)
    assert rows["numa"]["cross_write"] < rows["morton"]["cross_write"]
    with pytest.raises(SystemExit):
        cachemiss.main(["--topology", "socket:x"])
    assert "--topology: hwloc rejects 'socket:x'" in capsys.readouterr().err


@needs_valgrind
def test_module_entry_point_runs_the_replay(tmp_path):
    """``python -m zcoll.cachemiss`` (the command the NUMA issue names) runs the same replay
    as ``python -m zcoll.bench cachemiss``, in a process of its own, without mpiexec."""
    out = tmp_path / "numa.json"
    argv = ["--topology", TWO_SOCKETS, "--ops", "alltoall", "--procs", "8", "--blocks", "64"]
    argv += ["--orders", "morton,numa", "--cache", "paper", "--json", str(out), "--no-progress"]
    env = launcher_free_env()  # the suite may run under mpiexec -n 1
    done = subprocess.run(
        [sys.executable, "-m", "zcoll.cachemiss", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert "P = 8 on 2 NUMA domains: bytes per rank in another domain" in done.stdout
    rows = {x["order"]: x for x in json.loads(out.read_text())["results"]}
    numa = [i % 6 // 3 for i in range(8)]
    for order, row in rows.items():
        assert row["cross_write"] == independent_cross_writes(8, order, numa, 64)
    help_text = subprocess.run(
        [sys.executable, "-m", "zcoll.cachemiss", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    ).stdout
    assert help_text.startswith("usage: python -m zcoll.cachemiss")
