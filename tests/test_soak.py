"""Randomized soak: thousands of mixed calls, every result against mpi4py's, memory flat.

One seeded random sequence (the same on every rank; ZCOLL_SOAK_SEED overrides the seed,
ZCOLL_SOAK_CALLS the length) mixes every collective zcoll has -- alltoall, allgather, allreduce,
reduce, reduce_scatter_block, bcast, barrier -- over random dtypes (every family), shapes (zero
size and odd sizes included), block orders, copy modes and reduction algorithms, in place and
not, with send and receive buffers in the arena or private, on WORLD and on dups and splits
(reversed keys, halves) that are created and freed during the run, while arena arrays are
allocated and dropped. Data movement is compared byte for byte with mpi4py's collective on the
same bytes; reductions with mpi4py's on the same typed data, where the result does not depend on
the order of combination (integers and bool with every op, floats with min and max). At the end
of a second pass of the same sequence, the process's RSS is that after the first pass within
1 MiB and the arena's bytes in use are the same. The seed and the counts per collective are
printed (pytest -s), and every failure names the seed and the call, so a run can be repeated
exactly.
"""

from __future__ import annotations

import gc
import os
from collections import Counter

import numpy as np
import pytest
from mpi4py import MPI
from test_leaks import SANITIZED, rss_bytes

import zcoll
from conftest import DTYPES, all_ranks_agree
from zcoll import _context

SEED = int(os.environ.get("ZCOLL_SOAK_SEED", "20261123"))
CALLS = int(os.environ.get("ZCOLL_SOAK_CALLS", "2000"))
MIB = 2**20
ORDERS = ["auto", *zcoll.ORDERS]
COPIES = ["auto", *zcoll.COPY_MODES]
ALGORITHMS = ["auto", *zcoll.REDUCE_ALGORITHMS]
COUNTS = [0, 1, 2, 3, 7, 16, 33, 100, 1000, 4099]
INTEGERS = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]
# (dtype, op) pairs whose result is the same in any order of combination.
EXACT_REDUCTIONS = (
    [(t, op) for t in INTEGERS for op in ("sum", "prod", "min", "max", "band", "bor", "bxor")]
    + [(t, op) for t in (np.float32, np.float64) for op in ("min", "max")]
    + [(np.bool_, op) for op in ("land", "lor", "lxor")]
)
# NumPy's fold of every op: the reference for reductions is the ranks' inputs gathered with
# mpi4py and folded with it. (Not mpi4py's own reduction: Open MPI 4.1's AVX op component
# saturates 8- and 16-bit integer sums and compares unsigned 64-bit integers as signed -- found
# by this soak, open-mpi/ompi#8045 -- where NumPy and zcoll wrap and compare as the C types do.)
UFUNCS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
          "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor,
          "land": np.logical_and, "lor": np.logical_or, "lxor": np.logical_xor}  # fmt: skip


def as_bytes(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8).reshape(-1)


class Soak:
    """The run's state: the shared decision stream, the communicators and arena arrays alive,
    and what went wrong."""

    def __init__(self, world: MPI.Intracomm, seed: int) -> None:
        self.world = world
        self.decide = np.random.default_rng(seed)  # identical on every rank
        self.data = np.random.default_rng([seed, world.rank])  # this rank's values
        self.comms: list[MPI.Intracomm] = [world]
        self.kept: list[np.ndarray] = []  # arena arrays held for a while, then dropped
        self.counts: Counter[str] = Counter()
        self.failures: list[str] = []
        self.step = 0

    # -- decisions (the same on every rank) ------------------------------------------------

    def pick(self, options):
        return options[int(self.decide.integers(len(options)))]

    def rank_of(self, comm) -> int:
        """A rank of `comm`, drawn alike on every rank even where the communicators in use
        differ in size (the halves of an odd world)."""
        return int(self.decide.integers(1 << 30)) % comm.size

    def coin(self, p: float = 0.5) -> bool:
        return bool(self.decide.random() < p)

    def values(self, shape, dtype) -> np.ndarray:
        dt = np.dtype(dtype)
        if dt.kind == "b":
            return self.data.integers(0, 2, shape).astype(dt)
        if dt.kind in "iu":
            return self.data.integers(np.iinfo(dt).min, np.iinfo(dt).max, shape, dtype=dt,
                                      endpoint=True)  # fmt: skip
        real = self.data.standard_normal(shape) * 100
        if dt.kind == "c":
            return (real + 1j * self.data.standard_normal(shape)).astype(dt)
        return real.astype(dt)

    def buffer(self, comm, shape, dtype, fill: bool) -> np.ndarray:
        """A buffer in the arena (collective) or private, as the stream decides."""
        a = zcoll.empty(comm, shape, dtype) if self.coin() else np.empty(shape, dtype)
        if fill:
            a[...] = self.values(shape, dtype)
        return a

    def check(self, ok: bool, what: str) -> None:
        if not ok:
            self.failures.append(f"seed {SEED} call {self.step}: {what}")

    # -- communicators and arena arrays, changed during the run ----------------------------

    def churn(self) -> None:
        kind = self.pick(["dup", "split_reversed", "split_halves", "free", "alloc", "drop"])
        if kind == "dup":
            self.comms.append(self.world.Dup())
        elif kind == "split_reversed":
            self.comms.append(self.world.Split(0, key=self.world.size - 1 - self.world.rank))
        elif kind == "split_halves":
            self.comms.append(self.world.Split(self.world.rank % 2, key=self.world.rank))
        elif kind == "free" and len(self.comms) > 1:
            self.comms.pop(1 + int(self.decide.integers(len(self.comms) - 1))).Free()
        elif kind == "alloc":
            comm = self.pick(self.comms)
            self.kept.append(zcoll.zeros(comm, int(self.pick(COUNTS)) + 1, np.float64))
        elif kind == "drop" and self.kept:
            self.kept.pop(int(self.decide.integers(len(self.kept))))
        self.counts[f"churn:{kind}"] += 1

    def close(self) -> None:
        for comm in self.comms[1:]:
            comm.Free()
        self.comms = [self.world]
        self.kept.clear()

    # -- the collectives --------------------------------------------------------------------

    def alltoall(self, comm) -> None:
        p, dtype = comm.size, self.pick(DTYPES)
        shape = (p, int(self.pick(COUNTS)), *((3,) if self.coin(0.2) else ()))
        send = self.buffer(comm, shape, dtype, fill=True)
        ref = np.empty_like(send)
        comm.Alltoall(as_bytes(send), as_bytes(ref))
        order, copy = self.pick(ORDERS), self.pick(COPIES)
        if self.coin(0.2):  # in place: the received blocks replace the sent ones
            recv = send
            zcoll.alltoall(comm, zcoll.IN_PLACE, recv, order=order, copy=copy)
        else:
            recv = self.buffer(comm, shape, dtype, fill=False) if self.coin(0.7) else None
            recv = zcoll.alltoall(comm, send, recv, order=order, copy=copy)
        self.check(np.array_equal(as_bytes(recv), as_bytes(ref)),
                   f"alltoall {np.dtype(dtype)} {shape} {order} {copy}")  # fmt: skip

    def allgather(self, comm) -> None:
        dtype = self.pick(DTYPES)
        shape = (int(self.pick(COUNTS)), *((2,) if self.coin(0.2) else ()))
        send = self.buffer(comm, shape, dtype, fill=True)
        ref = np.empty((comm.size, *shape), dtype)
        comm.Allgather(as_bytes(send), as_bytes(ref))
        order, copy = self.pick(ORDERS), self.pick(COPIES)
        recv = self.buffer(comm, ref.shape, dtype, fill=False) if self.coin(0.7) else None
        recv = zcoll.allgather(comm, send, recv, order=order, copy=copy)
        self.check(np.array_equal(as_bytes(recv), as_bytes(ref)),
                   f"allgather {np.dtype(dtype)} {shape} {order} {copy}")  # fmt: skip

    def reduction(self, comm) -> None:
        kind = self.pick(["allreduce", "reduce", "reduce_scatter_block"])
        dtype, op = self.pick(EXACT_REDUCTIONS)
        count = int(self.pick(COUNTS))
        n = count * comm.size if kind == "reduce_scatter_block" else count
        send = self.buffer(comm, n, dtype, fill=True)
        algorithm, root = self.pick(ALGORITHMS), self.rank_of(comm)
        inputs = np.empty((comm.size, n), dtype)
        comm.Allgather(as_bytes(send), as_bytes(inputs))
        folded = UFUNCS[op].reduce(inputs, axis=0).astype(dtype)
        if kind == "allreduce":
            ref = folded
            if self.coin(0.2):
                got = send.copy()
                zcoll.allreduce(comm, zcoll.IN_PLACE, got, op, algorithm=algorithm)
            else:
                got = zcoll.allreduce(comm, send, None, op, algorithm=algorithm)
        elif kind == "reduce":
            ref = folded
            got = zcoll.reduce(comm, send, None, op, root=root, algorithm=algorithm)
            if comm.rank != root:
                self.check(got is None, f"reduce returned data on a non-root rank (root {root})")
                return
        else:
            ref = folded[comm.rank * count : (comm.rank + 1) * count]
            got = zcoll.reduce_scatter_block(comm, send, None, op, algorithm=algorithm)
        self.check(got is not None and np.array_equal(got, ref),
                   f"{kind} {np.dtype(dtype)} {op} n={n} {algorithm} root={root}")  # fmt: skip

    def bcast(self, comm) -> None:
        dtype, count = self.pick(DTYPES), int(self.pick(COUNTS))
        root = self.rank_of(comm)
        buf = self.buffer(comm, count, dtype, fill=True)
        ref = buf.copy()
        comm.Bcast(as_bytes(ref), root=root)
        zcoll.bcast(comm, buf, root=root)
        self.check(np.array_equal(as_bytes(buf), as_bytes(ref)), f"bcast {np.dtype(dtype)} "
                   f"{count} root={root}")  # fmt: skip

    def barrier(self, comm) -> None:
        zcoll.barrier(comm)

    def one_call(self) -> None:
        if self.coin(0.05):
            self.churn()
            return
        comm = self.pick(self.comms)
        name = self.pick(["alltoall", "allgather", "reduction", "bcast", "barrier"])
        getattr(self, name)(comm)
        self.counts[name] += 1


def arena_in_use(soak: Soak) -> int:
    return sum(_context.lookup(c).core.arena_bytes_in_use for c in soak.comms)


@pytest.mark.skipif(
    MPI.COMM_WORLD.size not in (2, 3, 4), reason="the soak runs at P = 2, 3 and 4 (and their "
    "virtual-node runs)"
)  # fmt: skip
def test_randomized_soak(world):
    """The sequence twice: the first pass brings every cache and pool to its high-water mark;
    the second, the same calls again, must end where it started (a leak grows with calls)."""
    counts, rss, arena = [], [], []
    for _ in range(2):
        soak = Soak(world, SEED)
        for soak.step in range(CALLS):
            soak.one_call()
        soak.close()  # WORLD only, no arena array held
        gc.collect()
        world.Barrier()
        all_ranks_agree(world, not soak.failures, "; ".join(soak.failures[:5]))
        counts.append(soak.counts)
        rss.append(rss_bytes())
        arena.append(arena_in_use(soak))
    if world.rank == 0:
        print(f"\nsoak: seed {SEED}, {CALLS} calls twice at P={world.size}: "
              + ", ".join(f"{k} {v}" for k, v in sorted(counts[1].items())))  # fmt: skip
    calls = sum(v for k, v in counts[1].items() if not k.startswith("churn"))
    all_ranks_agree(world, calls >= 0.9 * CALLS, f"only {calls} collective calls")
    grew = rss[1] - rss[0]
    all_ranks_agree(world, SANITIZED or abs(grew) < MIB, f"RSS changed by {grew / MIB:.2f} MiB")
    all_ranks_agree(world, arena[1] == arena[0], f"arena in use: {arena[0]} -> {arena[1]}")
