"""How an allgather's blocks beyond its round cross nodes: rank to rank ("direct"), or the
SC'05 concurrent exchange among the nodes' leaders with concurrency index C ("concurrent";
``cpp/zcoll/leaders_exchange.hpp`` has the algorithm). Both run in the extension, in the same
call as the round and the node's part.

The choice (and C) is the engine's crossing policy's (``cpp/zcoll/crossing_policy.hpp``: a
forced choice, else the tuning table's ``internode`` rules from ``python -m zcoll.tune
--internode``, else the direct path); it is the same on every rank (the table's rules are
those rank 0 read, shared with the context). The table's "round" rules set the round's limit
there too. This module names the methods, forces one for a communicator (tests, benchmarks,
the tuner) and asks the policy what it chose.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from mpi4py import MPI

from . import _aggregated, _core, _tuning
from ._context import Context, context

__all__ = [
    "CONCURRENT",
    "DIRECT",
    "METHODS",
    "ROUND",
    "SPLIT_BYTES",
    "Choice",
    "choose",
    "force",
]

ROUND = "round"
DIRECT = "direct"
CONCURRENT = "concurrent"
#: How blocks beyond the round's limit cross nodes (the tuning table's internode rules name
#: these, and ROUND, which sets the round's limit).
METHODS = (DIRECT, CONCURRENT)
#: Blocks of this many bytes and more are split in halves between pair and co-pair (C >= 2).
SPLIT_BYTES: int = _core.LEADERS_SPLIT_BYTES


@dataclass(frozen=True)
class Choice:
    """How an allgather's blocks cross nodes: `method` "round" (in the call's round of
    messages), "direct" (every rank to every remote rank) or "concurrent" (the leaders'
    concurrent exchange with index `concurrency`)."""

    method: str
    concurrency: int = 0

    def label(self) -> str:
        return self.method if self.method != CONCURRENT else f"C={self.concurrency}"


# --- which method ------------------------------------------------------------------------------


def force(comm: MPI.Comm, choice: Choice | None) -> Choice | None:
    """Make every later allgather across nodes on `comm` use `choice` (None: the table or the
    built-in rule again); returns the previous forced choice. Every rank of `comm` calls it
    alike, between collectives (benchmarks and tests); other communicators keep the policy's
    choices. On one node, where nothing crosses, it only checks `choice` and returns None.

    A forced choice applies to every block size: while one is set, the round between nodes
    carries every block ("round") or none (``_aggregated.force``; set back on
    ``force(comm, None)``) -- for every collective on `comm`, so "round" and "direct" force an
    alltoall's way too (``zcoll.tune --internode`` times both collectives so)."""
    if choice is not None:
        _check_choice(choice)  # before anything is set: a bad choice changes nothing
    ctx = context(comm)
    if not ctx.multi_node:
        return None
    state = _state(ctx)
    # The crossing policy's override (crossing_overrides::allgather): the policy's route (no
    # choice, or "round", which forces the carry instead), rank to rank, or the leaders' exchange.
    crossing = {None: 0, ROUND: 0, DIRECT: 1, CONCURRENT: 2}
    concurrency = choice.concurrency if choice is not None and choice.method == CONCURRENT else 0
    ctx.core.nodes_force_allgather_crossing(
        crossing[choice.method if choice else None], concurrency
    )
    if choice is not None:
        aggregation = _aggregated.force(comm, choice.method == ROUND)
        if state.forced is None:
            state.aggregation_before = aggregation
    elif state.forced is not None:
        _aggregated.force(comm, state.aggregation_before)
    previous, state.forced = state.forced, choice
    return previous


def _check_choice(choice: Choice) -> None:
    known = (ROUND, *METHODS)
    if choice.method not in known:
        raise ValueError(f"internode method must be one of {known}, got {choice.method!r}")
    if choice.method == CONCURRENT and not (
        type(choice.concurrency) is int and choice.concurrency >= 1
    ):
        raise ValueError(f"concurrency must be a positive integer, got {choice.concurrency!r}")


class _State:
    """What this module keeps per context: the forced choice (:func:`force`) with the round's
    carry as it was before it."""

    def __init__(self) -> None:
        self.forced: Choice | None = None
        self.aggregation_before: bool | None = None


_states: weakref.WeakKeyDictionary[Context, _State] = weakref.WeakKeyDictionary()


def _state(ctx: Context) -> _State:
    state = _states.get(ctx)
    if state is None:
        state = _states[ctx] = _State()
    return state


def choose(ctx: Context, block: int) -> Choice:
    """How this multi-node allgather of `block`-byte blocks, beyond its round's limit, crosses
    nodes: the engine's crossing policy decides (a forced choice, else the tuning table's
    rules for these nodes when the tuning mode is not "off", else the direct path). The same
    on every rank."""
    method, concurrency = ctx.core.nodes_allgather_route(block)
    if method == _tuning.INTERNODE_METHOD_CODES[CONCURRENT]:
        return Choice(CONCURRENT, concurrency)
    return Choice(DIRECT)
