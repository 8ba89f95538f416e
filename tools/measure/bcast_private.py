"""bcast from a plain (private) root buffer: staged, pulled by CMA, and zcoll's rule, against
comm.Bcast, in one launch (docs/performance.md, "bcast of a private root buffer").

The root rewrites its whole buffer before every call (as a program would), so no way gets
cache lines that stay shared between the cores from call to call. Each way runs in
alternating blocks of calls on one communicator (its context's CMA threshold switched between
blocks: 0 pulls, 2**62 stages, the default applies the rule); medians over the rounds, us per
call including the root's rewrite, the largest rank's.

    mpiexec -n 2 python3 tools/measure/bcast_private.py [SIZES_KIB] [ROUNDS] [CALLS]
"""

import sys
import time

import numpy as np
from mpi4py import MPI

import zcoll
from zcoll import _context

comm = MPI.COMM_WORLD
sizes = [int(k) for k in (sys.argv[1] if len(sys.argv) > 1 else "16,64,256").split(",")]
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 7
calls = int(sys.argv[3]) if len(sys.argv) > 3 else 200
core = _context.context(comm).core
rule = core.cma_bytes
ways = {"staged": 2**62, "pulled": 0, "rule": rule}


def block(n: int, run) -> float:
    source = np.arange(n, dtype=np.float64)
    buf = np.empty(n)
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(calls):
        if comm.rank == 0:
            buf[...] = source
        run(buf)
    took = (time.perf_counter() - start) / calls * 1e6
    return comm.allreduce(took, op=MPI.MAX)


for kib in sizes:
    n = kib * 1024 // 8
    times: dict[str, list[float]] = {w: [] for w in [*ways, "mpi"]}
    for _ in range(rounds):
        for way, threshold in ways.items():
            core.cma_bytes = threshold
            times[way].append(block(n, lambda b: zcoll.bcast(comm, b, root=0)))
        core.cma_bytes = rule
        times["mpi"].append(block(n, lambda b: comm.Bcast(b, root=0)))
    if comm.rank == 0:
        med = {w: float(np.median(t)) for w, t in times.items()}
        print(f"{kib:5d} KiB  " + "  ".join(f"{w} {m:7.2f}" for w, m in med.items()))
