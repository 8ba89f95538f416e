"""Names and codes of zcoll's collectives, block orders, copy modes and barriers.

The one list lives in the C++ header ``cpp/zcoll/registry.hpp`` and reaches Python through
``_core``; every table here is built from it, never retyped. Modules bind these objects by
assignment (``from ._registry import ORDER_CODES``), so a lookup on the hot path is one global
dict access.
"""

from __future__ import annotations

from . import _core

__all__ = [
    "AUTO",
    "BARRIERS",
    "BARRIER_CODES",
    "COLLECTIVES",
    "COPY_CODES",
    "COPY_ISAS",
    "COPY_MODES",
    "EAGER",
    "OPS",
    "ORDERS",
    "ORDER_CODES",
    "RULE_ORDERS",
    "RULE_ORDER_CODES",
    "RULE_COPIES",
    "SCHEDULE_KINDS",
]

#: The value of ``order=`` and ``copy=`` that lets zcoll choose.
AUTO = "auto"
#: The eager path's name where a tuning rule may name it in place of an order.
EAGER = "eager"
#: Block orders accepted by ``order=`` (besides "auto"), by engine code.
ORDERS: tuple[str, ...] = _core.ORDERS
#: Copy modes accepted by ``copy=`` (besides "auto"), by engine code.
COPY_MODES: tuple[str, ...] = _core.COPY_MODES
#: Streaming-copy kernels, by engine code.
COPY_ISAS: tuple[str, ...] = _core.COPY_ISAS
#: Node barrier algorithms (``ZCOLL_BARRIER``), by engine code.
BARRIERS: tuple[str, ...] = _core.BARRIERS
#: Kinds of block schedule (see :func:`zcoll.schedule`).
SCHEDULE_KINDS: tuple[str, ...] = _core.SCHEDULE_KINDS
#: Operation name -> engine code, for every operation a node context runs.
OPS: dict[str, int] = dict(_core.OPS)
#: The collectives a tuning table and online tuning know, in engine order.
COLLECTIVES: tuple[str, ...] = _core.TUNED_COLLECTIVES

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
