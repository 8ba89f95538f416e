"""A fresh Dup's context and first zcoll call: medians of one rank's times, each from a
barrier (the bench's ``setup --parts comm`` reports means, largest over the ranks).

    mpiexec -n 2 python first_call.py [iterations]
"""

import sys
import time

import numpy as np
from mpi4py import MPI

import zcoll

comm = MPI.COMM_WORLD
iterations = int(sys.argv[1]) if len(sys.argv) > 1 else 200
a = np.zeros(comm.size)
b = np.empty_like(a)
zcoll.alltoall(comm, a, b)  # the parent's context and pool
times = []
for _ in range(iterations):
    d = comm.Dup()
    comm.Barrier()
    start = time.perf_counter_ns()
    zcoll.alltoall(d, a, b)
    times.append((time.perf_counter_ns() - start) / 1e3)
    d.Free()
every = comm.gather(times[iterations // 10 :])
if comm.rank == 0:
    for rank, t in enumerate(every):
        p10, p50, p90 = np.percentile(t, [10, 50, 90])
        print(f"rank {rank}: median {p50:.1f} us (p10 {p10:.1f}, p90 {p90:.1f})")
