"""alltoall on a communicator spanning several nodes (TPDS'18 §2.5, "MN-CO").

Every call on several nodes starts with a round of messages between nodes that carries each
rank's call record to every rank (`Context.node_round`, engine `aggregate.hpp`): one message
per ordered pair of nodes, sent and received by ranks spread over each node. An alltoall puts
its blocks into the same round: phase 1 (engine) packs, in Morton order and equal shares,
every block bound for another node into that node's message; phase 2 is the round's MPI
point-to-point exchange, N * (N - 1) messages instead of P * (P - P/N); phase 3 (engine)
checks every rank's record -- so the check across nodes costs no extra round -- and copies the
node-local and the received blocks into the receive buffers.

Blocks larger than `AGGREGATE_MAX_BLOCK` are not packed (a copy that saves nothing once
messages are large): the round then carries the records only, and after the node-local part
the blocks between nodes go rank to rank. Either way nothing is written into a receive buffer
before every rank of every node is known to have valid, matching arguments.
"""

from __future__ import annotations

import numpy as np

from . import _core, _registry
from ._context import Context

__all__ = ["AGGREGATE_MAX_BLOCK", "alltoall_between_nodes", "force", "messages_per_call"]

ALLTOALL = _registry.ALLTOALL

#: Largest block (bytes) an alltoall across nodes packs into one message per node pair
#: (measured with virtual nodes of 2 on 2 cores; README "Across nodes").
AGGREGATE_MAX_BLOCK = 16384

_forced: bool | None = None


def force(aggregate: bool | None) -> bool | None:
    """Make every later alltoall across nodes of this process aggregate (True) or go rank to
    rank (False) whatever its block size; None: the size rule again. Returns the previous
    setting. Local, but it must be the same on every rank (benches and tests call it on every
    rank, between collectives)."""
    global _forced
    previous, _forced = _forced, aggregate
    return previous


def messages_per_call(nodes: list[int], aggregate: bool) -> int:
    """MPI messages between nodes per alltoall on nodes of `nodes` ranks each: one per ordered
    node pair when aggregated (N * (N - 1)), else those plus one per pair of ranks on
    different nodes (P * (P - P/N) for equal nodes)."""
    n = len(nodes)
    pairs = n * (n - 1)
    if aggregate:
        return pairs
    p = sum(nodes)
    return pairs + sum(q * (p - q) for q in nodes)


def alltoall_between_nodes(ctx: Context, sendbuf, recvbuf, order, copy) -> None:
    """One alltoall on a multi-node context: aggregated (the blocks travel in the round that
    carries the call records) up to `AGGREGATE_MAX_BLOCK`, else the round carries the records
    only and the blocks go rank to rank after the node-local part."""
    from ._collectives import COPY_CODES, IN_PLACE, ORDER_CODES, _exchange_remote, _option_error  # noqa: PLC0415  # noqa: PLC0415

    send = sendbuf if sendbuf is IN_PLACE else np.ascontiguousarray(sendbuf)
    code = ORDER_CODES.get(order) if type(order) is str else None
    copy_code = COPY_CODES.get(copy) if type(copy) is str else None
    if code is None or copy_code is None:  # the ranks still meet, then all raise it
        error = _option_error(order, copy)
        assert error is not None
        message = f"zcoll.{ALLTOALL}: {error}"
        ctx.agree(ALLTOALL, _core.error_record(isinstance(error, TypeError), message))
        raise AssertionError("unreachable: the round raises the published error")
    record = ctx.core.record(ALLTOALL, send, recvbuf, code, copy_code)
    block = int(getattr(recvbuf, "nbytes", 0)) // ctx.size
    aggregate = block <= AGGREGATE_MAX_BLOCK if _forced is None else _forced
    data = (send, recvbuf, code, copy_code) if aggregate else None
    if ctx.node_round(ALLTOALL, record, data):
        return
    ctx.core.alltoall(send, recvbuf, code, copy_code)  # the node-local blocks
    _exchange_remote(ctx, ALLTOALL, send, recvbuf, block)
