"""alltoallv on plain NumPy arrays pulled by CMA with uneven loads: zcoll with the senders'
pushes (the measured rule, or any size with --push 0), without them, and MPI, in one launch
(medians of 11 alternating blocks; largest over the ranks).

    mpiexec -n 2 python uneven_pulls.py bench 64K 256K 1M 4M   # the bench's counts per block
    mpiexec -n 2 python uneven_pulls.py busy 8K 16K 64K        # every rank sends X to rank 0

`bench`: `python -m zcoll.bench alltoallv`'s uneven counts for that nominal block
(zcoll.bench.vcollectives.draw_counts); `busy`: every rank sends X bytes to rank 0 and nothing
to the others, so rank 0 receives P x X and the others nothing.
"""

import sys
import time

import numpy as np
from mpi4py import MPI

import zcoll
from zcoll import _context
from zcoll.bench.vcollectives import displacements, draw_counts

comm = MPI.COMM_WORLD
p, me = comm.size, comm.rank
core = _context.context(comm).core
NEVER = 2**62


def size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def per_call(f, n: int) -> float:
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - start) / n * 1e6


def counts_for(mode: str, x: int) -> np.ndarray:
    if mode == "bench":
        return draw_counts(x, (p, p))
    counts = np.zeros((p, p), np.int64)
    counts[:, 0] = x
    return counts


def measure(counts: np.ndarray, push_bytes: int) -> dict[str, float]:
    sc, rc = [int(c) for c in counts[me]], [int(c) for c in counts[:, me]]
    send = np.random.default_rng(me).integers(0, 256, max(1, sum(sc)), dtype=np.uint8)
    got, want = np.empty(max(1, sum(rc)), np.uint8), np.empty(max(1, sum(rc)), np.uint8)
    sendspec = [send, (sc, displacements(sc))]
    received = (rc, displacements(rc))  # made once: a call's own cost is what is timed
    into_got, into_want = [got, received], [want, received]
    variants = {
        "push": (lambda: zcoll.alltoallv(comm, sendspec, into_got), push_bytes),
        "no push": (lambda: zcoll.alltoallv(comm, sendspec, into_got), NEVER),
        "MPI": (lambda: comm.Alltoallv(sendspec, into_want), None),
    }
    n = max(20, int(3e4 / (int(counts.sum()) / p / 1024 + 4)))
    times: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(11):  # the order turns every round: no variant always runs first
        names = list(variants)[round_ % 3 :] + list(variants)[: round_ % 3]
        for name in names:
            f, push = variants[name]
            if push is not None:
                core.cma_push_bytes = push
            times[name].append(per_call(f, n))
    if not np.array_equal(got[: sum(rc)], want[: sum(rc)]):
        raise AssertionError(f"rank {me}: zcoll's result differs from MPI's")
    return {k: comm.allreduce(float(np.median(v)), op=MPI.MAX) for k, v in times.items()}


def main() -> None:
    args = sys.argv[1:]
    push = core.cma_push_bytes
    if "--push" in args:
        at = args.index("--push")
        push = size(args[at + 1])
        del args[at : at + 2]
    mode, sizes = args[0], [size(a) for a in args[1:]]
    core.cma_bytes = 0  # pulled whatever the size
    for x in sizes:
        t = measure(counts_for(mode, x), push)
        if me == 0:
            print(
                f"P={p} {mode} {x >> 10} KiB: push {t['push']:.1f}, no push {t['no push']:.1f}, "
                f"MPI {t['MPI']:.1f} us; MPI/push {t['MPI'] / t['push']:.2f}x, "
                f"MPI/no push {t['MPI'] / t['no push']:.2f}x",
                flush=True,
            )


main()
