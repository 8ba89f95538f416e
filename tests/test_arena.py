"""The shared arena: allocation, visibility between ranks, reuse, growth."""

from __future__ import annotations

import numpy as np
import pytest

import zcoll
from helpers import DTYPES, all_ranks_agree
from zcoll._context import lookup


def test_empty_zeros_empty_like(world):
    a = zcoll.empty(world, (3, 4), np.float32)
    z = zcoll.zeros(world, 5, np.complex128)
    e = zcoll.empty_like(world, z)
    ok = a.shape == (3, 4) and a.dtype == np.float32 and a.flags.c_contiguous
    ok &= a.flags.writeable and bool((z == 0).all()) and e.shape == (5,) and e.dtype == z.dtype
    ok &= all(zcoll.is_shared(x) for x in (a, z, e)) and not zcoll.is_shared(np.zeros(3))
    ok &= not zcoll.is_shared([1, 2, 3])
    all_ranks_agree(world, ok)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_and_alignment(world, dtype):
    a = zcoll.zeros(world, (2, 3), dtype)
    ok = a.dtype == np.dtype(dtype) and a.ctypes.data % 64 == 0 and bool((a == 0).all())
    all_ranks_agree(world, ok)


def test_zero_size_and_per_rank_shapes(world):
    a = zcoll.empty(world, (0, 7))
    b = zcoll.empty(world, (world.rank + 1, 2), np.int8)  # shapes differ between ranks
    ok = a.size == 0 and a.shape == (0, 7) and b.shape == (world.rank + 1, 2)
    all_ranks_agree(world, ok)


def test_every_rank_sees_every_rank_array(world):
    mine = zcoll.empty(world, (world.rank + 2,), np.int64)
    mine[:] = world.rank * 100 + np.arange(world.rank + 2)
    world.Barrier()
    views = zcoll.peer_arrays(world, mine)
    ctx = lookup(world)
    ok = len(views) == world.size
    for r, v in enumerate(views):
        same_node = ctx.node_of[r] == ctx.node_of[world.rank]
        if not same_node:
            ok &= v is None
            continue
        ok &= v is not None and np.array_equal(v, r * 100 + np.arange(r + 2))
    world.Barrier()
    # Write into the next rank's array (on this node), read back by the owner.
    right = (world.rank + 1) % world.size
    if views[right] is not None:
        views[right][0] = -world.rank - 1
    world.Barrier()
    left = (world.rank - 1) % world.size
    if views[left] is not None:
        ok &= mine[0] == -left - 1
    all_ranks_agree(world, ok, "peer views")


def test_peer_arrays_rejects_private_arrays(world):
    shared = zcoll.zeros(world, 3)  # collective: every rank allocates
    a = np.zeros(3) if world.rank == world.size - 1 else shared
    with pytest.raises(ValueError, match="not in an arena"):
        zcoll.peer_arrays(world, a)


def test_freed_memory_is_reused(world):
    ctx = lookup(world)
    before = ctx.core.arena_bytes_in_use
    for _ in range(50):
        a = zcoll.empty(world, 100_000)  # 800 kB each
        a[:] = 1.0
        del a
    segments = ctx.core.segment_count
    for _ in range(50):
        a = zcoll.empty(world, 100_000)
        del a
    ok = ctx.core.arena_bytes_in_use == before and ctx.core.segment_count == segments
    all_ranks_agree(world, ok, "allocations are returned and reused")


def test_arena_grows_past_any_fixed_size(world):
    arrays = [zcoll.empty(world, 4 << 20, np.uint8) for _ in range(6)]  # 24 MiB per rank
    big = zcoll.empty(world, 40 << 20, np.uint8)
    for i, a in enumerate([*arrays, big]):
        a[::4096] = i  # touch every page
    ok = all(int(a[0]) == i for i, a in enumerate([*arrays, big]))
    all_ranks_agree(world, ok)


def test_arrays_survive_their_communicator(world):
    dup = world.Dup()
    a = zcoll.zeros(dup, 10)
    dup.Free()
    a += 2
    all_ranks_agree(world, bool((a == 2).all()))


def test_partitions_are_coloured_so_ranks_buffers_miss_different_cache_sets(world, monkeypatch):
    """A new node pool's first array on node rank r starts 576*r bytes (mod 4 KiB) into a
    page, so equal-offset blocks of different ranks fall in different L1 sets (pools off: the
    Dup makes a pool of its own rather than allocating after the world's arrays)."""
    monkeypatch.setenv("ZCOLL_NODE_POOLS", "0")
    comm = world.Dup()
    try:
        node_rank = lookup(comm).node_rank
        a = zcoll.empty(comm, (3,), np.uint8)
        offsets = comm.allgather((node_rank, a.ctypes.data % 4096))
    finally:
        comm.Free()
    expected = [(r, (r * 9 * 64) % 4096) for r, _ in offsets]
    all_ranks_agree(world, offsets == expected, f"page offsets {offsets}")
