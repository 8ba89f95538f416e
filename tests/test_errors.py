"""Bad input: a clear error on every rank, no hang, nothing corrupted, context still usable.

Most cases make only the last rank misbehave: the others passed valid arguments and must still
raise (the error travels through the shared control block, or across nodes through MPI).
"""

from __future__ import annotations

import ctypes
import functools
import mmap

import numpy as np
import pytest
from mpi4py import MPI

import zcoll
from helpers import all_ranks_agree, private_buffers_by
from helpers.errors import expect_everywhere, last, outcome
from zcoll import _context


def test_wrong_first_axis(world):
    p = world.size
    n = p + 1 if last(world) else p
    expect_everywhere(world, lambda: zcoll.alltoall(world, np.zeros((n, 3))), ValueError,
                      fragment="shape[0]")  # fmt: skip


@pytest.mark.parametrize("first", [False, True])
def test_neighbourhood_calls_without_recvbuf_bad_on_one_rank(world, first):
    """neighbor_alltoall and neighbor_allgather without recvbuf, the last rank's sendbuf wrong
    (a first axis other than its out-degree; Python objects): every rank raises its error,
    named, and the grid works on; `first`: as the grid's first call (its context made then)."""
    cart = world.Create_cart([world.size], periods=[True])
    try:
        if not first:
            zcoll.neighbor_allgather(cart, np.zeros(3))
        rows = 5 if last(world) else 2
        expect_everywhere(cart, lambda: zcoll.neighbor_alltoall(cart, np.zeros((rows, 3))),
                          ValueError, fragment="out-degree 2")  # fmt: skip
        mine = np.array([object()] * 3) if last(world) else np.zeros(3)
        expect_everywhere(cart, lambda: zcoll.neighbor_allgather(cart, mine), TypeError,
                          fragment=f"[rank {world.size - 1}]")  # fmt: skip
    finally:
        cart.Free()


def test_one_d_not_divisible(world):
    n = 2 * world.size + (1 if last(world) else 0)
    if world.size == 1:
        pytest.skip("every length is divisible by 1")
    expect_everywhere(world, lambda: zcoll.alltoall(world, np.zeros(n)), ValueError,
                      fragment="divisible")  # fmt: skip


def test_block_sizes_differ_between_ranks(world):
    if world.size == 1:
        pytest.skip("needs two ranks to disagree")
    count = 4 if last(world) else 3
    send = np.zeros((world.size, count))
    expect_everywhere(world, lambda: zcoll.alltoall(world, send, np.empty_like(send)), ValueError,
                      fragment="block sizes differ")  # fmt: skip
    mine = np.zeros(count)
    expect_everywhere(world, lambda: zcoll.allgather(world, mine, np.empty((world.size, count))),
                      ValueError, fragment="block sizes differ")  # fmt: skip


def test_dtypes_differ_between_ranks(world):
    if world.size == 1:
        pytest.skip("needs two ranks to disagree")
    dtype = np.int64 if last(world) else np.float64
    send = np.zeros((world.size, 2), dtype)
    expect_everywhere(world, lambda: zcoll.alltoall(world, send, np.empty_like(send)), TypeError,
                      fragment="dtypes differ")  # fmt: skip


def test_send_and_recv_dtypes_differ(world):
    send = np.zeros((world.size, 2), np.float32)
    recv = np.zeros((world.size, 2), np.float64 if last(world) else np.float32)
    expect_everywhere(world, lambda: zcoll.alltoall(world, send, recv), TypeError,
                      fragment="dtype")  # fmt: skip


def test_recv_size_wrong(world):
    send = np.zeros((world.size, 2))
    recv = np.zeros((world.size, 3 if last(world) else 2))
    expect_everywhere(world, lambda: zcoll.alltoall(world, send, recv), ValueError,
                      fragment="elements")  # fmt: skip


def test_read_only_recvbuf(world):
    send = np.zeros((world.size, 2))
    recv = np.zeros_like(send)
    recv.flags.writeable = not last(world)
    expect_everywhere(world, lambda: zcoll.alltoall(world, send, recv), ValueError,
                      fragment="read-only")  # fmt: skip
    gathered = np.zeros((world.size, 2))
    gathered.flags.writeable = not last(world)
    expect_everywhere(world, lambda: zcoll.allgather(world, send[0], gathered), ValueError,
                      fragment="read-only")  # fmt: skip


def test_non_contiguous_recvbuf(world):
    send = np.zeros((world.size, 2))
    wide = np.zeros((world.size, 4))
    recv = wide[:, ::2] if last(world) else np.zeros_like(send)
    expect_everywhere(world, lambda: zcoll.alltoall(world, send, recv), ValueError,
                      fragment="C-contiguous")  # fmt: skip


def test_recvbuf_not_an_array(world):
    send = np.zeros((world.size, 2))
    recv = [0.0] * (2 * world.size) if last(world) else np.zeros_like(send)
    expect_everywhere(world, lambda: zcoll.alltoall(world, send, recv), TypeError,
                      fragment="numpy.ndarray")  # fmt: skip


def test_overlapping_buffers(world):
    buf = np.zeros((world.size, 4))
    send, recv = (buf, buf) if last(world) else (buf, np.zeros_like(buf))
    expect_everywhere(world, lambda: zcoll.alltoall(world, send, recv), ValueError,
                      fragment="overlap")  # fmt: skip


def test_object_arrays(world):
    send = np.empty((world.size, 2), object if last(world) else np.float64)
    expect_everywhere(world, lambda: zcoll.alltoall(world, send), TypeError,
                      fragment="Python objects")  # fmt: skip


def test_in_place_without_recvbuf(world):
    send = zcoll.IN_PLACE if last(world) else np.zeros((world.size, 2))
    expect_everywhere(world, lambda: zcoll.alltoall(world, send), ValueError, fragment="IN_PLACE")


def test_in_place_on_some_ranks_only(world):
    if world.size == 1:
        pytest.skip("needs two ranks to disagree")
    buf = np.zeros((world.size, 2))
    send = zcoll.IN_PLACE if last(world) else np.ones_like(buf)
    expect_everywhere(world, lambda: zcoll.alltoall(world, send, buf), ValueError,
                      fragment="IN_PLACE")  # fmt: skip


def test_unknown_order(world):
    order = "zigzag" if last(world) else "morton"
    send = np.zeros((world.size, 2))
    expect_everywhere(world, lambda: zcoll.alltoall(world, send, order=order), ValueError,
                      fragment="order")  # fmt: skip


def test_orders_differ_between_ranks(world):
    if world.size == 1:
        pytest.skip("needs two ranks to disagree")
    order = "hilbert" if last(world) else "morton"
    send = np.zeros((world.size, 2))
    expect_everywhere(world, lambda: zcoll.alltoall(world, send, np.empty_like(send), order=order),
                      ValueError, fragment="order")  # fmt: skip


def test_different_collectives_at_once(world):
    if world.size == 1:
        pytest.skip("needs two ranks to disagree")
    send = np.zeros((world.size, 1))

    def mismatched():
        if last(world):
            zcoll.allgather(world, send[0], np.empty_like(send))
        else:
            zcoll.alltoall(world, send, np.empty_like(send))

    expect_everywhere(world, mismatched, ValueError, fragment="different operations")


def test_bad_allocation_arguments(world):
    shape = (-1, 3) if last(world) else (2, 3)
    expect_everywhere(world, lambda: zcoll.empty(world, shape), ValueError, fragment="negative")
    dtype = object if last(world) else float
    expect_everywhere(world, lambda: zcoll.empty(world, 3, dtype), TypeError, fragment="objects")


def test_freed_and_null_communicators(world):
    dup = world.Dup()
    zcoll.alltoall(dup, np.zeros((dup.size, 1)))
    dup.Free()
    with pytest.raises(ValueError, match="COMM_NULL"):
        zcoll.alltoall(dup, np.zeros((world.size, 1)))
    with pytest.raises(ValueError, match="COMM_NULL"):
        zcoll.empty(MPI.COMM_NULL, 3)
    with pytest.raises(TypeError, match="communicator"):
        zcoll.alltoall("not a communicator", np.zeros(1))


def test_intercommunicator_rejected(world):
    if world.size < 2:
        pytest.skip("an intercommunicator needs two groups")
    local = world.Split(world.rank % 2, key=world.rank)
    inter = local.Create_intercomm(0, world, 1 - world.rank % 2, tag=7)
    try:
        with pytest.raises(TypeError, match="intercommunicator"):
            zcoll.alltoall(inter, np.zeros((inter.size, 1)))
    finally:
        inter.Free()
        local.Free()


def test_arena_arrays_outlive_their_communicator(world):
    dup = world.Dup()
    a = zcoll.empty(dup, (world.size, 4), np.int32)
    a[:] = world.rank
    dup.Free()
    a += 1  # still mapped
    got = zcoll.alltoall(world, a)  # staged: its arena is gone
    all_ranks_agree(world, bool((got == np.arange(world.size)[:, None] + 1).all()))


def _buffer_with_read_only_page(nbytes: int, page: int):
    """A private (anonymous mapping) byte array of `nbytes` whose page number `page` is made
    read-only, and the function that makes it writable again."""
    array = np.frombuffer(mmap.mmap(-1, nbytes), np.uint8)
    libc = ctypes.CDLL(None, use_errno=True)
    address = ctypes.c_void_p(array.ctypes.data + page * mmap.PAGESIZE)

    def protect(prot: int) -> None:
        if libc.mprotect(address, ctypes.c_size_t(mmap.PAGESIZE), prot) != 0:
            raise OSError(ctypes.get_errno(), "mprotect")

    protect(mmap.PROT_READ)
    return array, lambda: protect(mmap.PROT_READ | mmap.PROT_WRITE)


def test_failed_pull_raises_on_every_rank(world, monkeypatch):
    """A CMA read that fails (on the last rank of each node, a read-only page where rank 0's
    block lands) spoils only that rank's result, yet every rank raises it, in each call that
    pulls blocks: alltoall, allgather, bcast, the persistent plans and a Transfer. Afterwards
    the calls work. Run on each node's ranks (virtual nodes included): across nodes, the
    blocks between nodes are not pulled."""
    from zcoll.fft.pencil import Transfer

    monkeypatch.setenv("ZCOLL_COLD_RUNS", "0")  # the Transfer's first run is zcoll's own
    ctx = _context.context(world)
    node = world.Split(min(ctx.local_ranks), world.rank)
    try:
        core = _context.context(node).core
        if node.size == 1 or core.cma[0] != "works":
            all_ranks_agree(node, True)
            return
        block = 16 * mmap.PAGESIZE  # rank 0's block: pages 0-15 of the last rank's buffer
        p, failing = node.size, node.rank == node.size - 1
        send = np.full((p, block), node.rank + 1, np.uint8)
        transfer = Transfer(node, (p, p * block), np.uint8, (p, block), 0, (1, p * block), 1)
        calls = {
            "alltoall": lambda recv: zcoll.alltoall(node, send, recv),
            "allgather": lambda recv: zcoll.allgather(node, send[0], recv),
            "bcast": lambda recv: zcoll.bcast(node, recv[0]),
            "alltoall_init": lambda recv: zcoll.alltoall_init(node, send, recv)(),
            "allgather_init": lambda recv: zcoll.allgather_init(node, send[0], recv)(),
            # Rows of p blocks: the destination's block j of each row comes from rank j.
            "Transfer": lambda recv: transfer.forward(send, recv.reshape(1, p * block)),
        }

        def prepare(name: str, recv: np.ndarray) -> None:  # bcast's root holds the data
            recv[...] = 7 if name == "bcast" and node.rank == 0 else 0

        for name, call in calls.items():
            with private_buffers_by(node, "cma"):
                if failing:
                    flat, writable = _buffer_with_read_only_page(p * block, 1)
                    recv = flat.reshape(p, block)
                else:
                    recv, writable = np.zeros((p, block), np.uint8), lambda: None
                if not failing:
                    prepare(name, recv)
                kind, message = outcome(functools.partial(call, recv))
                writable()
                ok = kind == "OSError" and "process_vm_readv from" in message
                all_ranks_agree(node, ok, f"{name}: {kind}: {message}")
                prepare(name, recv)
                call(recv)  # the next call works
                if name == "bcast":
                    ok = bool((recv[0] == 7).all())
                elif name == "Transfer":
                    ok = bool((recv.reshape(p, block) == np.arange(1, p + 1)[:, None]).all())
                else:  # row j from rank j, which sent j + 1 everywhere
                    ok = bool((recv == np.arange(1, p + 1)[:, None]).all())
                all_ranks_agree(node, ok, f"{name} after the failure")
    finally:
        node.Free()
