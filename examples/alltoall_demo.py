"""A guided tour of zcoll's collectives: allocate, exchange, verify, time.

Run it under MPI, with any number of ranks on one node (or several)::

    mpiexec -n 4 python examples/alltoall_demo.py

Every element sent encodes (source rank, destination rank, index), so the result of each
exchange can be checked against a closed form, and against what MPI itself returns. The script
exits with status 1 if any check fails on any rank.
"""

import functools
import sys

import numpy as np
from mpi4py import MPI

import zcoll

comm = MPI.COMM_WORLD
rank, P = comm.rank, comm.size
failures = []


def say(*args):
    """Print on rank 0 only, so the output is not repeated P times."""
    if rank == 0:
        print(*args, flush=True)


def check(what, ok):
    """Record a check; it passes only if it passed on every rank (a collective call)."""
    ok = comm.allreduce(bool(ok), op=MPI.LAND)
    say(f"  {'ok  ' if ok else 'FAIL'} {what}")
    if not ok:
        failures.append(what)


def encode(src, dst, idx):
    """The value rank `src` sends to rank `dst` at position `idx` (needs P, N < 1000)."""
    return src * 1_000_000 + dst * 1_000 + idx


# 1. Where are we? topology() is collective: every rank calls it, every rank gets the same answer.
say(zcoll.topology(comm))
say()

# 2. Ordinary NumPy arrays, as an mpi4py program has them. Block j of `send` (send[j], N
#    elements) is what this rank sends to rank j.
N = 5
send = np.empty((P, N), np.int64)
send[...] = encode(rank, np.arange(P)[:, None], np.arange(N))
say(f"alltoall on P={P} ranks, blocks of {N} int64")

# After alltoall, block j of the result came from rank j: recv[j, i] == encode(j, rank, i).
expected = encode(np.arange(P)[:, None], rank, np.arange(N))
reference = np.empty((P, N), np.int64)
comm.Alltoall(send, reference)  # what the MPI library computes
check("comm.Alltoall gives the closed form", np.array_equal(reference, expected))

# Every order traverses the P x P block matrix differently; all give the same result. "row" is
# the simple baseline (SH-Naive), "auto" lets zcoll choose.
for order in (*zcoll.ORDERS, "auto"):
    recv = zcoll.alltoall(comm, send, order=order)  # no recvbuf: one is allocated in the arena
    check(f"zcoll.alltoall order={order:8} == closed form == MPI", np.array_equal(recv, expected))

# Like comm.Alltoall(send, recv): the result goes into a given recvbuf.
recv = np.empty_like(send)
zcoll.alltoall(comm, send, recv)
check("zcoll.alltoall(comm, send, recv)", np.array_equal(recv, expected))

# In place: the blocks of `buf` are exchanged where they are.
buf = send.copy()
zcoll.alltoall(comm, zcoll.IN_PLACE, buf)
check("zcoll.alltoall with IN_PLACE", np.array_equal(buf, expected))

# Arrays in the node's shared arena (zcoll.empty: collective, each rank its own shape) and on
# the shared heap (NumPy's own allocations, after zcoll.use_shared_heap()) are read by the peers
# in place; plain arrays are pulled from the senders by CMA, or staged when small.
arena = zcoll.empty_like(comm, send)
arena[...] = send
with zcoll.use_shared_heap():
    heap = send.copy()
for name, a in (("arena", arena), ("heap", heap)):
    got = zcoll.alltoall(comm, a, np.empty_like(a))
    check(f"zcoll.alltoall on {name} arrays", np.array_equal(got, expected))

# 3. allgather: every rank receives every rank's whole buffer. Gathering `send` itself gives each
#    rank the full P x P x N matrix: gathered[j, d, i] == encode(j, d, i).
everything = encode(np.arange(P)[:, None, None], np.arange(P)[None, :, None], np.arange(N))
mpi_gathered = np.empty((P, P, N), np.int64)
comm.Allgather(send, mpi_gathered)
check("comm.Allgather gives the closed form", np.array_equal(mpi_gathered, everything))
for order in (*zcoll.ORDERS, "auto"):
    gathered = zcoll.allgather(comm, send, order=order)  # shape (P, P, N), in the arena
    same = np.array_equal(gathered, everything)
    check(f"zcoll.allgather order={order:7} == closed form == MPI", same)


# 4. A quick timing against MPI (python -m zcoll.bench does this thoroughly).
def seconds_per_call(fn, iterations):
    """Warm up, line the ranks up, time a loop; report the slowest rank's average (OSU style)."""
    fn()
    comm.Barrier()
    start = MPI.Wtime()
    for _ in range(iterations):
        fn()
    return comm.allreduce((MPI.Wtime() - start) / iterations, op=MPI.MAX)


def time_block(block):
    """Time comm.Alltoall and zcoll.alltoall on plain, heap and arena arrays of `block`-byte
    blocks; MPI gets plain arrays, as an mpi4py program has them."""
    iterations = max(10, min(1000, 2**22 // (P * block)))
    msend = ((rank * P + np.arange(P)[:, None]) % 256 * np.ones(block)).astype(np.uint8)
    mrecv = np.empty_like(msend)
    with zcoll.use_shared_heap():
        hsend, hrecv = msend.copy(), np.empty_like(msend)
    asend, arecv = zcoll.empty_like(comm, msend), zcoll.empty_like(comm, msend)
    asend[...] = msend
    pairs = ((msend, np.empty_like(msend)), (hsend, hrecv), (asend, arecv))
    times = [seconds_per_call(lambda: comm.Alltoall(msend, mrecv), iterations)]
    for send_, recv_ in pairs:
        call = functools.partial(zcoll.alltoall, comm, send_, recv_)
        times.append(seconds_per_call(call, iterations))
    return times, all(np.array_equal(r, mrecv) for _, r in pairs)


# Latency per call in microseconds; speedup = MPI latency / zcoll's on that kind of array.
say(f"\n{'block':>9} {'MPI (us)':>10} {'plain':>8} {'heap':>8} {'arena':>8}  speedups")
same = True
for block in (64, 4096, 256 * 1024):  # bytes per block
    times, equal = time_block(block)
    same = same and equal
    us = " ".join(f"{t * 1e6:8.1f}" for t in times[1:])
    say(
        f"{block:>7} B {times[0] * 1e6:10.1f} {us}  "
        + " ".join(f"{times[0] / t:.2f}x" for t in times[1:])
    )
check("the timed zcoll results equal MPI's", same)

say(f"\n{len(failures)} check(s) failed" if failures else "\nall checks passed")
sys.exit(1 if failures else 0)
