"""zcoll: ordered shared-memory collectives for mpi4py programs.

NumPy arrays live in a per-node shared arena (:func:`empty`), so every rank on a node can read
and write every other rank's buffers; :func:`alltoall` and :func:`allgather` then move each
block with a single copy, in a cache-friendly order over the P x P block matrix (Morton,
Hilbert, row, column), partitioned over the ranks, with no MPI call on the hot path.
:func:`allreduce`, :func:`reduce`, :func:`reduce_scatter_block`, :func:`bcast` and
:func:`barrier` combine and copy buffers on the same shared heap (HPDC'13's algorithms).
:func:`alltoallv`, :func:`allgatherv` and the neighbourhood collectives (:func:`neighbor_alltoall`
and its kin, on Cartesian and graph topologies) run irregular patterns the same way (TPDS'18 §3).
"""

from __future__ import annotations

from importlib.metadata import version as _distribution_version

from . import (
    _copy,  # noqa: F401  (applies ZCOLL_COPY_ISA)
    _mpi_library,
)
from ._arena import empty, empty_like, is_shared, peer_arrays, zeros
from ._collectives import IN_PLACE, allgather, alltoall
from ._context import set_timeout, set_tuning
from ._core import PeerError
from ._heap import heap_stats, in_heap, use_shared_heap
from ._plans import Plan, allgather_init, alltoall_init
from ._reductions import (
    REDUCE_ALGORITHMS,
    REDUCE_OPS,
    allreduce,
    barrier,
    bcast,
    reduce,
    reduce_scatter_block,
)
from ._registry import COPY_MODES, ORDERS
from ._schedule import Schedule, schedule
from ._settings import Settings, get_timeout, get_tuning, settings
from ._topology import RankPlacement, Topology, topology
from ._tuning import load_tuning, tuning_path
from ._vcollectives import (
    VPlan,
    allgatherv,
    allgatherv_init,
    alltoallv,
    alltoallv_init,
    neighbor_allgather,
    neighbor_allgather_init,
    neighbor_allgatherv,
    neighbor_allgatherv_init,
    neighbor_alltoall,
    neighbor_alltoall_init,
    neighbor_alltoallv,
    neighbor_alltoallv_init,
)

__version__ = _distribution_version("zcoll")  # pyproject.toml's version, the one place

_mpi_library.warn_on_mismatch()

__all__ = [
    "COPY_MODES",
    "IN_PLACE",
    "ORDERS",
    "PeerError",
    "REDUCE_ALGORITHMS",
    "REDUCE_OPS",
    "Plan",
    "RankPlacement",
    "Schedule",
    "Settings",
    "Topology",
    "VPlan",
    "__version__",
    "allgather",
    "allgather_init",
    "allgatherv",
    "allgatherv_init",
    "allreduce",
    "alltoall",
    "alltoall_init",
    "alltoallv",
    "alltoallv_init",
    "barrier",
    "bcast",
    "empty",
    "empty_like",
    "get_timeout",
    "get_tuning",
    "heap_stats",
    "in_heap",
    "is_shared",
    "load_tuning",
    "neighbor_allgather",
    "neighbor_allgather_init",
    "neighbor_allgatherv",
    "neighbor_allgatherv_init",
    "neighbor_alltoall",
    "neighbor_alltoall_init",
    "neighbor_alltoallv",
    "neighbor_alltoallv_init",
    "peer_arrays",
    "reduce",
    "reduce_scatter_block",
    "schedule",
    "set_timeout",
    "set_tuning",
    "settings",
    "topology",
    "tuning_path",
    "use_shared_heap",
    "zeros",
]
