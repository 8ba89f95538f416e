"""Tests of zcoll's topology: hwloc counts, cache sizes, rank placements, synthetic machines.

Run alone (one rank) or under ``mpiexec -n P python -m pytest tests/test_topology.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mpi4py import MPI

from zcoll import RankPlacement, Topology, _core, _node, topology

SYS_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")
SYNTHETIC = "pack:2 numa:1 core:4 pu:1"


@pytest.fixture(scope="module")
def comm():
    return MPI.COMM_WORLD


@pytest.fixture(scope="module")
def topo(comm):
    return topology(comm)


def on_this_machine() -> bool:
    return _core.machine_topology()["source"] == "this machine"


def sysfs_size(text: str) -> int:
    """Parse a sysfs cache size such as ``48K`` or ``32768K``."""
    units = {"K": 1024, "M": 1024**2, "G": 1024**3}
    text = text.strip()
    if text[-1:] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)


def sysfs_caches() -> dict[str, int]:
    """The data/unified cache sizes of cpu0 as Linux reports them, keyed l1d, l2, l3."""
    sizes: dict[str, int] = {}
    for index in sorted(SYS_CACHE.glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = sysfs_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if kind in ("Data", "Unified") and level in (1, 2, 3):
            sizes.setdefault("l1d" if level == 1 else f"l{level}", size)
    return sizes


# Loads the extension by its path, without the zcoll package (whose import starts MPI).
CHILD = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("zcoll._core", sys.argv[1])
core = importlib.util.module_from_spec(spec)
spec.loader.exec_module(core)
print(json.dumps([core.machine_topology(), core.locate_this_process()]))
"""


def run_core(env_updates: dict[str, str], tmp_path: Path) -> list[dict]:
    """[machine_topology(), locate_this_process()] of a fresh process with extra environment.

    hwloc reads HWLOC_SYNTHETIC once per process, hence the new process.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("HWLOC_")}
    env.update(env_updates)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, _core.__file__],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_counts_are_positive_and_nested(topo):
    assert isinstance(topo, Topology)
    assert topo.packages > 0 and topo.numa_nodes > 0 and topo.cores > 0 and topo.pus > 0
    assert topo.pus >= topo.cores >= topo.packages


def test_caches_are_known_on_this_machine(topo):
    if not on_this_machine():
        pytest.skip(f"hwloc describes another machine: {topo.source}")
    assert topo.l1d > 0 and topo.l2 > 0 and topo.l3 > 0
    assert topo.l1d < topo.l2 <= topo.l3


def test_caches_match_sysfs(topo):
    if not on_this_machine():
        pytest.skip(f"hwloc describes another machine: {topo.source}")
    expected = sysfs_caches()
    if set(expected) != {"l1d", "l2", "l3"}:
        pytest.skip(f"{SYS_CACHE} does not list L1d, L2 and L3 sizes (found {sorted(expected)})")
    assert {"l1d": topo.l1d, "l2": topo.l2, "l3": topo.l3} == expected


def test_every_rank_gets_the_same_topology(comm, topo):
    everyone = comm.allgather(topo)
    assert all(t == topo for t in everyone)


def test_ranks_in_order_with_own_placement(comm, topo):
    assert len(topo.ranks) == comm.size
    assert [p.rank for p in topo.ranks] == list(range(comm.size))
    assert all(isinstance(p, RankPlacement) for p in topo.ranks)
    me = topo.ranks[comm.rank]
    assert me.pid == os.getpid()
    assert me.host == MPI.Get_processor_name()
    assert sum(topo.ranks_per_node.values()) == comm.size


def test_placements_are_within_the_machine(topo):
    if not on_this_machine():
        pytest.skip(f"hwloc describes another machine: {topo.source}")
    for p in topo.ranks:
        assert p.pu >= 0
        assert 0 <= p.core < topo.cores
        assert 0 <= p.numa_node < topo.numa_nodes
        assert 0 <= p.package < topo.packages
        assert isinstance(p.bound, bool)


def test_str_lists_every_rank(topo):
    text = str(topo)
    lines = text.splitlines()
    assert "PU" in lines[0] and "L2" in lines[0]
    assert len(lines) == 2 + len(topo.ranks)
    for p, line in zip(topo.ranks, lines[2:]):
        assert line.split()[:3] == [str(p.rank), p.host, str(p.pid)]


def test_synthetic_machine(tmp_path):
    machine, where = run_core({"HWLOC_SYNTHETIC": SYNTHETIC}, tmp_path)
    assert machine["packages"] == 2
    assert machine["numa_nodes"] == 2
    assert machine["cores"] == 8
    assert machine["pus"] == 8
    assert SYNTHETIC in machine["source"]
    # This process runs on none of the synthetic machine's PUs.
    assert where == {
        "pu": -1,
        "core": -1,
        "numa_node": -1,
        "package": -1,
        "l3_cache": -1,
        "bound": False,
    }


def test_invalid_synthetic_falls_back_to_this_machine(tmp_path):
    machine, _ = run_core({"HWLOC_SYNTHETIC": "no-such-level:3"}, tmp_path)
    assert machine["source"].startswith("this machine")
    assert "rejected" in machine["source"]
    assert machine["pus"] > 0


def test_described_machine_places_node_ranks_on_its_pus(comm, monkeypatch, tmp_path):
    # ZCOLL_TOPOLOGY: node rank i on PU i (wrapping) of the described machine, not bound.
    described = "package:2 numa:2 core:2 pu:1"
    monkeypatch.setenv("ZCOLL_TOPOLOGY", described)
    t = topology(comm)
    assert (t.packages, t.numa_nodes, t.cores, t.pus) == (2, 4, 8, 8)
    assert t.source == f"ZCOLL_TOPOLOGY: synthetic {described}"
    node, _ = _node.split_node(comm)  # zcoll's node: a virtual one where configured
    ranks_here = node.allgather(comm.rank)
    node.Free()
    for i, rank in enumerate(ranks_here):  # this node's ranks, in node rank order
        p = t.ranks[rank]
        assert (p.pu, p.core, p.numa_node, p.package) == (i % 8, i % 8, i % 8 // 2, i % 8 // 4)
        assert not p.bound
    # An hwloc XML file works as well.
    xml = tmp_path / f"machine-{comm.rank}.xml"
    xml.write_text(two_socket_xml())
    monkeypatch.setenv("ZCOLL_TOPOLOGY", str(xml))
    t = topology(comm)
    assert t.source.startswith("ZCOLL_TOPOLOGY: XML file ")  # rank 0's file
    assert t.source.endswith("machine-0.xml")
    assert (t.packages, t.numa_nodes, t.cores, t.pus) == (2, 2, 4, 4)
    assert [t.ranks[r].numa_node for r in ranks_here] == [
        i % 4 // 2 for i in range(len(ranks_here))
    ]


def two_socket_xml() -> str:
    """hwloc 2 XML of 2 packages, each one NUMA node and 2 single-PU cores."""

    def obj(kind: str, index: int, cpus: int, nodes: int, inner: str = "", extra: str = "") -> str:
        sets = (
            f'cpuset="{cpus:#x}" complete_cpuset="{cpus:#x}" '
            f'nodeset="{nodes:#x}" complete_nodeset="{nodes:#x}"'
        )
        head = f'<object type="{kind}" os_index="{index}" {sets}{extra}'
        return f"{head}>{inner}</object>" if inner else f"{head}/>"

    packages = ""
    for p in range(2):
        cores = "".join(
            obj("Core", c, 1 << c, 1 << p, obj("PU", c, 1 << c, 1 << p)) for c in (2 * p, 2 * p + 1)
        )
        numa = obj("NUMANode", p, 3 << 2 * p, 1 << p, extra=' local_memory="1073741824"')
        packages += obj("Package", p, 3 << 2 * p, 1 << p, numa + cores)
    machine = obj(
        "Machine", 0, 0xF, 0x3, packages, extra=' allowed_cpuset="0xf" allowed_nodeset="0x3"'
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE topology SYSTEM "hwloc2.dtd">\n'
        f'<topology version="2.0">{machine}</topology>\n'
    )


def test_comm_null_is_rejected():
    with pytest.raises(ValueError, match="COMM_NULL"):
        topology(MPI.COMM_NULL)


def test_non_communicator_is_rejected():
    with pytest.raises(TypeError):
        topology("COMM_WORLD")


def test_intercommunicator_is_rejected(comm):
    if comm.size < 2:
        pytest.skip("an intercommunicator needs at least 2 ranks")
    half = comm.Split(comm.rank % 2, comm.rank)
    inter = half.Create_intercomm(0, comm, 1 - comm.rank % 2, tag=17)
    try:
        with pytest.raises(TypeError, match="intercommunicator"):
            topology(inter)
    finally:
        inter.Free()
        half.Free()
