"""reduce or allreduce (float64 sum) of plain NumPy buffers: each algorithm staged and pulled
by CMA, zcoll's rule, and MPI, in one launch (medians of 7 blocks in an order that turns every
round; us per call, the largest rank's).

    mpiexec -n 2 python reduce_private.py reduce|allreduce SIZES_KIB [--fresh]

With --fresh every rank rewrites its input before each call (as a program computing it would;
the rewrite is timed for every variant alike), so no variant reads cache lines that stay
unchanged, and so shared between the cores, from call to call as the OSU loop's do.
"""

import sys
import time

import numpy as np
from mpi4py import MPI

import zcoll
from zcoll import _context

comm = MPI.COMM_WORLD
core = _context.context(comm).core
RULE = core.cma_bytes
NEVER = 2**62
CALLS = 200


def block(n: int, run, fresh: bool) -> float:
    source = np.arange(n, dtype=np.float64) + comm.rank
    x, out = source.copy(), np.empty(n)
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(CALLS):
        if fresh:
            x[...] = source
        run(x, out)
    return comm.allreduce((time.perf_counter() - start) / CALLS * 1e6, op=MPI.MAX)


def variants(op: str) -> dict:
    """name -> (CMA threshold, call)."""
    zfn = zcoll.reduce if op == "reduce" else zcoll.allreduce
    extra = {"root": 0} if op == "reduce" else {}
    mpi = comm.Reduce if op == "reduce" else comm.Allreduce
    out: dict = {}
    for way, threshold in (("staged", NEVER), ("pulled", 0)):
        for alg in ("flat", "tiled"):
            out[f"{way} {alg}"] = (
                threshold,
                lambda x, o, a=alg: zfn(comm, x, o, algorithm=a, **extra),
            )
    out["rule"] = (RULE, lambda x, o: zfn(comm, x, o, **extra))
    out["MPI"] = (RULE, lambda x, o: mpi(x, o, **extra))
    return out


def main() -> None:
    op, sizes = sys.argv[1], [int(k) for k in sys.argv[2].split(",")]
    fresh = "--fresh" in sys.argv
    ways = variants(op)
    for kib in sizes:
        n = kib * 1024 // 8
        times: dict[str, list[float]] = {w: [] for w in ways}
        for round_ in range(7):
            names = list(ways)[round_ % len(ways) :] + list(ways)[: round_ % len(ways)]
            for name in names:
                core.cma_bytes, run = ways[name]
                times[name].append(block(n, run, fresh))
        core.cma_bytes = RULE
        if comm.rank == 0:
            med = {w: float(np.median(t)) for w, t in times.items()}
            print(
                f"P={comm.size} {op} {'fresh' if fresh else 'same'} {kib} KiB: "
                + ", ".join(f"{w} {m:.1f}" for w, m in med.items()),
                flush=True,
            )


main()
