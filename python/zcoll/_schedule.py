"""The block schedule of the ordered collectives: which rank copies which block, in what order.

A collective over P ranks moves the P x P blocks of a block matrix whose row d is rank d's
receive buffer and whose column s holds the blocks that came from rank s. The schedule is a
traversal of that matrix in one of :data:`zcoll.ORDERS`, cut into P contiguous segments; rank r
copies segment r, in order. The ``"numa"`` order (TPDS'18 §2.4) is instead made per NUMA domain:
each domain's ranks copy only blocks bound for the domain's receive buffers, in s staggered
steps. This module exposes it for inspection and plotting; the collectives compute and cache
their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import _core
from ._registry import FULL, ORDERS, SCHEDULE_KINDS

__all__ = ["SCHEDULE_KINDS", "Schedule", "schedule"]

# SCHEDULE_KINDS: every block (out-of-place collectives), the off-diagonal pairs of an
# in-place alltoall (each pair once, as (max, min)), the off-diagonal blocks of an in-place
# allgather.


@dataclass(frozen=True)
class Schedule:
    """A traversal of the P x P block matrix, cut into one segment per rank.

    Attributes
    ----------
    p : int
        Number of ranks.
    order : str
        The block order, one of ``zcoll.ORDERS``.
    kind : str
        One of :data:`SCHEDULE_KINDS`.
    blocks : numpy.ndarray
        ``(n, 2)`` int32 array of ``(dst, src)`` block coordinates in traversal order: the block
        rank ``src`` sends to rank ``dst`` (row ``dst``, column ``src`` of the receive matrix).
    starts : numpy.ndarray
        ``(p + 1,)`` int64 array: rank ``r`` copies ``blocks[starts[r]:starts[r + 1]]``.
    numa_nodes : tuple of int
        The ranks' NUMA nodes the ``"numa"`` order was made for (empty: one domain).
    """

    p: int
    order: str
    kind: str
    blocks: np.ndarray
    starts: np.ndarray
    numa_nodes: tuple[int, ...] = ()

    def segment(self, rank: int) -> np.ndarray:
        """Return the ``(dst, src)`` blocks rank `rank` copies, in order.

        Parameters
        ----------
        rank : int
            A rank, ``0 <= rank < p``.

        Returns
        -------
        numpy.ndarray
            A ``(k, 2)`` view of :attr:`blocks`.
        """
        if not 0 <= rank < self.p:
            raise ValueError(f"rank must be in [0, {self.p}), got {rank}")
        return self.blocks[self.starts[rank] : self.starts[rank + 1]]

    def ranks(self) -> np.ndarray:
        """Return, for each block of :attr:`blocks`, the rank that copies it.

        Returns
        -------
        numpy.ndarray
            An int64 array of length ``len(blocks)``, non-decreasing.
        """
        return np.repeat(np.arange(self.p), np.diff(self.starts))


def schedule(
    p: int, order: str, kind: str = FULL, numa_nodes: Sequence[int] | None = None
) -> Schedule:
    """Compute the block schedule zcoll's collectives use for `p` ranks and `order`.

    Parameters
    ----------
    p : int
        Number of ranks, at least 1.
    order : str
        One of ``zcoll.ORDERS``: ``"row"``, ``"column"``, ``"morton"``, ``"hilbert"``,
        ``"numa"``.
    kind : str, optional
        ``"full"`` (default: every block, as out-of-place alltoall and allgather copy them),
        ``"swap"`` (in-place alltoall) or ``"offdiagonal"`` (in-place allgather).
    numa_nodes : sequence of int, optional
        For ``"numa"``: the NUMA node of each of the `p` ranks (any integers; None, or any
        negative entry: unknown, one domain, which is Morton's schedule). Domain r (the r-th
        smallest node) copies the blocks bound for its ranks' receive buffers, in steps
        i = 0, 1, ...: the blocks from domain (r + i) % s, in Morton order, split evenly among
        its ranks. In place, a swap writes both blocks of its pair: pairs across two domains are
        split half and half between them. Other orders ignore it.

    Returns
    -------
    Schedule
        The blocks in traversal order and each rank's segment.

    Raises
    ------
    ValueError
        If `p` is below 1, `order` or `kind` is unknown, or `numa_nodes` is not `p` long.

    Examples
    --------
    >>> s = schedule(4, "morton")
    >>> s.segment(0).tolist()  # rank 0 copies the top-left 2 x 2 quadrant, in Z order
    [[0, 0], [0, 1], [1, 0], [1, 1]]
    """
    if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p < 1:
        raise ValueError(f"p must be an integer >= 1, got {p!r}")
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}; choose among {', '.join(ORDERS)}")
    if kind not in SCHEDULE_KINDS:
        raise ValueError(f"unknown kind {kind!r}; choose among {', '.join(SCHEDULE_KINDS)}")
    numa = tuple(int(n) for n in numa_nodes) if numa_nodes is not None else ()
    blocks, starts = _core.schedule(int(p), ORDERS.index(order), kind, list(numa))
    blocks.flags.writeable = False
    starts.flags.writeable = False
    return Schedule(int(p), order, kind, blocks, starts, numa)
