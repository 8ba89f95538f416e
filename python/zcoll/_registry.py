"""Names and codes of zcoll's collectives, block orders, copy modes and barriers.

The one list lives in the C++ header ``cpp/zcoll/registry.hpp`` and reaches Python through
``_core``; every table here is built from it, never retyped. The names are interned, so a
lookup with a string literal of the same name (``order="row"``) is an identity match, and the
per-call path binds its tables by assignment (``ORDER_CODES = _registry.ORDER_CODES``): a
``from``-import binding measured slower per lookup on CPython 3.11.
"""

from __future__ import annotations

from sys import intern

from . import _core

__all__ = [
    "ALLGATHER",
    "ALLOCATE",
    "ALLTOALL",
    "AUTO",
    "AVX2",
    "AVX512",
    "BARRIER",
    "BARRIERS",
    "BARRIER_CODES",
    "CENTRAL",
    "COLLECTIVES",
    "COLUMN",
    "COPY_CODES",
    "COPY_ISAS",
    "COPY_MODES",
    "DISSEMINATION",
    "EAGER",
    "ERROR",
    "FLAT",
    "FULL",
    "HILBERT",
    "HYBRID",
    "MORTON",
    "NONE",
    "NUMA",
    "OFFDIAGONAL",
    "OPS",
    "ORDERS",
    "ORDER_CODES",
    "PORTABLE",
    "ROW",
    "RULE_COPIES",
    "RULE_ORDERS",
    "RULE_ORDER_CODES",
    "SCHEDULE_KINDS",
    "SSE2",
    "STREAMING",
    "SWAP",
    "TEMPORAL",
    "TRANSFER",
    "PLAN",
    "START",
    "ALLREDUCE",
    "REDUCE",
    "REDUCE_SCATTER",
    "BCAST",
    "ALLTOALLV",
    "ALLGATHERV",
    "NEIGHBOR_ALLTOALL",
    "NEIGHBOR_ALLGATHER",
    "NEIGHBOR_ALLTOALLV",
    "NEIGHBOR_ALLGATHERV",
    "REDUCE_OPS",
    "REDUCE_OP_CODES",
    "REDUCE_ALGORITHMS",
    "REDUCE_ALGORITHM_CODES",
    "ELEMENT_TYPES",
]

#: The value of ``order=`` and ``copy=`` that lets zcoll choose.
AUTO: str = intern(_core.AUTO_NAME)
#: The eager path's name where a tuning rule may name it in place of an order.
EAGER: str = intern(_core.EAGER_NAME)
#: Block orders accepted by ``order=`` (besides "auto"), by engine code.
ORDERS: tuple[str, ...] = tuple(map(intern, _core.ORDERS))
#: Copy modes accepted by ``copy=`` (besides "auto"), by engine code.
COPY_MODES: tuple[str, ...] = tuple(map(intern, _core.COPY_MODES))
#: Streaming-copy kernels, by engine code.
COPY_ISAS: tuple[str, ...] = tuple(map(intern, _core.COPY_ISAS))
#: Node barrier algorithms (``ZCOLL_BARRIER``), by engine code.
BARRIERS: tuple[str, ...] = tuple(map(intern, _core.BARRIERS))
#: Kinds of block schedule (see :func:`zcoll.schedule`).
SCHEDULE_KINDS: tuple[str, ...] = tuple(map(intern, _core.SCHEDULE_KINDS))
#: Operation name -> engine code, for every operation a node context runs.
OPS: dict[str, int] = {intern(name): code for name, code in _core.OPS.items()}
#: The collectives a tuning table and online tuning know, in engine order.
COLLECTIVES: tuple[str, ...] = tuple(map(intern, _core.TUNED_COLLECTIVES))

#: Element-wise operations of the reductions (``op=``), by engine code.
REDUCE_OPS: tuple[str, ...] = tuple(map(intern, _core.REDUCE_OPS))
#: Reduction algorithms (``algorithm=``, besides "auto"), by engine code.
REDUCE_ALGORITHMS: tuple[str, ...] = tuple(map(intern, _core.REDUCE_ALGORITHMS))
#: Element types the reductions combine, by engine code.
ELEMENT_TYPES: tuple[str, ...] = tuple(map(intern, _core.ELEMENT_TYPES))
#: op name -> engine code.
REDUCE_OP_CODES = {name: code for code, name in enumerate(REDUCE_OPS)}
#: algorithm name -> engine code, "auto" included.
REDUCE_ALGORITHM_CODES = {
    AUTO: _core.AUTO_ALGORITHM,
    **{name: code for code, name in enumerate(REDUCE_ALGORITHMS)},
}

#: order name -> engine code, "auto" included.
ORDER_CODES = {AUTO: _core.AUTO_ORDER, **{name: code for code, name in enumerate(ORDERS)}}
#: copy mode name -> engine code, "auto" included.
COPY_CODES = {AUTO: _core.AUTO_COPY, **{name: code for code, name in enumerate(COPY_MODES)}}
#: barrier name -> engine code.
BARRIER_CODES = {name: code for code, name in enumerate(BARRIERS)}
#: order names a tuning rule may use (the eager path as well) -> engine code.
RULE_ORDER_CODES = {**ORDER_CODES, EAGER: _core.EAGER_ORDER}
#: The order names a tuning rule may use, and its copy names.
RULE_ORDERS: tuple[str, ...] = tuple(RULE_ORDER_CODES)
RULE_COPIES: tuple[str, ...] = tuple(COPY_CODES)

# The members Python code names, in code order. Unpacking the C++ lists (rather than retyping
# the strings) fails at import when the registry changes: extend the matching line then.
(
    NONE,
    ERROR,
    ALLOCATE,
    ALLTOALL,
    ALLGATHER,
    BARRIER,
    TRANSFER,
    PLAN,
    START,
    ALLREDUCE,
    REDUCE,
    REDUCE_SCATTER,
    BCAST,
    ALLTOALLV,
    ALLGATHERV,
    NEIGHBOR_ALLTOALL,
    NEIGHBOR_ALLGATHER,
    NEIGHBOR_ALLTOALLV,
    NEIGHBOR_ALLGATHERV,
) = OPS
ROW, COLUMN, MORTON, HILBERT, NUMA = ORDERS
TEMPORAL, STREAMING, HYBRID = COPY_MODES
PORTABLE, SSE2, AVX2, AVX512 = COPY_ISAS
FLAT, CENTRAL, DISSEMINATION = BARRIERS
FULL, SWAP, OFFDIAGONAL = SCHEDULE_KINDS
