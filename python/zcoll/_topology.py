"""Where a communicator runs: the machine as hwloc sees it and the placement of every rank.

The C++ core loads the hwloc topology once per process; :func:`topology` adds what only MPI
knows (host names, ranks) by allgathering each rank's placement, so that every rank can print
or inspect the same picture. hwloc honours ``HWLOC_SYNTHETIC`` and ``HWLOC_XMLFILE``, which
describe a machine other than this one (the placements are then unknown, -1). ``ZCOLL_TOPOLOGY``
describes one too, and places the ranks on it as zcoll's collectives then see them: node rank i
on the described machine's i-th PU (wrapping).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from mpi4py import MPI

from . import _core, _node, _settings

__all__ = ["Topology", "RankPlacement", "topology"]

_KIB = 1024
_MIB = 1024 * 1024
_COLUMNS = ("rank", "host", "pid", "pu", "core", "numa", "package", "bound")
_LEFT_ALIGNED = {"host", "bound"}


@dataclass(frozen=True)
class RankPlacement:
    """Where one rank of the communicator runs.

    Attributes
    ----------
    rank : int
        Rank in the communicator given to :func:`topology`.
    host : str
        Name of its node, from ``MPI.Get_processor_name()``.
    pid : int
        Its process id on that node.
    pu : int
        OS index of the hardware thread it last ran on (-1: unknown).
    core : int
        hwloc logical index of that core (-1: unknown).
    numa_node : int
        hwloc logical index of its nearest NUMA node (-1: unknown).
    package : int
        hwloc logical index of its package, or socket (-1: unknown).
    l3_cache : int
        hwloc logical index of the L3 cache above it (-1: none or unknown); the reductions'
        tree combines the ranks under one L3 first.
    bound : bool
        Whether it is pinned to a strict subset of the hardware threads it may use.
    """

    rank: int
    host: str
    pid: int
    pu: int
    core: int
    numa_node: int
    package: int
    l3_cache: int
    bound: bool


@dataclass(frozen=True)
class Topology:
    """The machine and the placement of every rank of a communicator.

    Attributes
    ----------
    packages, numa_nodes, cores, pus : int
        Counts on rank 0's node as hwloc sees it (zcoll assumes all nodes alike).
    l1d, l2, l3 : int
        Size in bytes of one L1 data, L2 and L3 cache (0: unknown).
    source : str
        ``"this machine"``, or the ``HWLOC_SYNTHETIC`` / ``HWLOC_XMLFILE`` description used,
        with a note in parentheses when hwloc rejected one of them, or ``"ZCOLL_TOPOLOGY:
        synthetic ..."`` / ``"ZCOLL_TOPOLOGY: XML file ..."`` for a described machine.
    ranks : tuple of RankPlacement
        One entry per rank, in rank order.
    """

    packages: int
    numa_nodes: int
    cores: int
    pus: int
    l1d: int
    l2: int
    l3: int
    source: str
    ranks: tuple[RankPlacement, ...]

    @property
    def ranks_per_node(self) -> dict[str, int]:
        """Number of ranks on each host, hosts in order of their first rank.

        Returns
        -------
        dict of str to int
            Host name to number of ranks there.
        """
        counts: dict[str, int] = {}
        for placement in self.ranks:
            counts[placement.host] = counts.get(placement.host, 0) + 1
        return counts

    def __str__(self) -> str:
        return "\n".join([_header(self), *_table(self.ranks)])


def topology(comm: MPI.Comm) -> Topology:
    """Describe the machine and where each rank of `comm` runs.

    Collective over `comm`: every rank must call it, and every rank gets an identical result.
    With ``ZCOLL_TOPOLOGY`` set, the machine is the described one and each rank's placement is
    the one zcoll simulates (node rank i on its i-th PU, not bound; pid and host are real).

    Parameters
    ----------
    comm : mpi4py.MPI.Comm
        An intracommunicator.

    Returns
    -------
    Topology
        Machine counts and cache sizes (from rank 0) and one placement per rank.

    Raises
    ------
    TypeError
        If `comm` is not an mpi4py communicator, or is an intercommunicator.
    ValueError
        If `comm` is ``MPI.COMM_NULL``.
    """
    _check_comm(comm)
    described = _settings.read("topology").value
    if described is None:
        where, machine = _core.locate_this_process(), _core.machine_topology()
    else:
        node, _ = _node.split_node(comm)  # the node ranks zcoll's contexts use
        node_rank = node.rank
        node.Free()
        where = _core.locate_described_pu(described, node_rank)
        machine = _core.described_topology(described)
        machine["source"] = f"ZCOLL_TOPOLOGY: {machine['source']}"
    mine = (MPI.Get_processor_name(), os.getpid(), where)
    everyone = comm.allgather((mine, machine if comm.rank == 0 else None))
    ranks = tuple(
        RankPlacement(rank=rank, host=host, pid=pid, **where)
        for rank, ((host, pid, where), _) in enumerate(everyone)
    )
    return Topology(**everyone[0][1], ranks=ranks)


def _check_comm(comm: object) -> None:
    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"zcoll.topology: expected an mpi4py communicator, got {type(comm)!r}")
    if comm == MPI.COMM_NULL:
        raise ValueError("zcoll.topology: the communicator is MPI.COMM_NULL")
    if comm.Is_inter():
        raise TypeError("zcoll.topology: intercommunicators are not supported")


def _format_bytes(n: int) -> str:
    if n <= 0:
        return "unknown"
    if n >= _MIB:
        return f"{n / _MIB:g} MiB"
    if n >= _KIB:
        return f"{n / _KIB:g} KiB"
    return f"{n} B"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _header(t: Topology) -> str:
    counts = ", ".join(
        [
            _plural(t.packages, "package"),
            _plural(t.numa_nodes, "NUMA node"),
            _plural(t.cores, "core"),
            _plural(t.pus, "PU"),
        ]
    )
    caches = f"L1d {_format_bytes(t.l1d)}, L2 {_format_bytes(t.l2)}, L3 {_format_bytes(t.l3)}"
    return f"Topology ({t.source}): {counts}; {caches}"


def _cells(p: RankPlacement) -> tuple[str, ...]:
    numbers = (p.rank, p.host, p.pid, p.pu, p.core, p.numa_node, p.package)
    return (*(str(v) for v in numbers), "yes" if p.bound else "no")


def _table(ranks: tuple[RankPlacement, ...]) -> list[str]:
    rows = [_COLUMNS, *(_cells(p) for p in ranks)]
    widths = [max(map(len, column)) for column in zip(*rows)]
    return [_line(row, widths) for row in rows]


def _line(row: tuple[str, ...], widths: list[int]) -> str:
    parts = [
        cell.ljust(width) if title in _LEFT_ALIGNED else cell.rjust(width)
        for title, cell, width in zip(_COLUMNS, row, widths)
    ]
    return "  " + "  ".join(parts).rstrip()
