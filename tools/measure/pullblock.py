"""As zcoll.bench alltoall --buffers numpy times it (blocks of iterations, each library on its
own arrays), alternating blocks: mpiexec -n 2 python pullblock.py MiB blocks iterations"""

import sys
import time

import numpy as np
from mpi4py import MPI

import zcoll

comm = MPI.COMM_WORLD
p = comm.size
block = int(float(sys.argv[1]) * 2**20)
rounds, its = int(sys.argv[2]), int(sys.argv[3])
data = np.random.default_rng(comm.rank).integers(0, 256, (p, block), np.uint8)
zs, zr = np.array(data), np.zeros_like(data)
ms, mr = np.array(data), np.zeros_like(data)
calls = {"mpi": lambda: comm.Alltoall(ms, mr), "zcoll": lambda: zcoll.alltoall(comm, zs, zr)}
res = {k: [] for k in calls}
for r in range(rounds):
    for name in list(calls) if r % 2 == 0 else list(calls)[::-1]:
        fn = calls[name]
        for _ in range(max(2, its // 10)):
            fn()
        comm.Barrier()
        t = time.perf_counter()
        for _ in range(its):
            fn()
        dt = (time.perf_counter() - t) / its
        res[name].append(comm.allreduce(dt, op=MPI.MAX))
assert (mr == zr).all()
if comm.rank == 0:
    m, z = np.median(res["mpi"]), np.median(res["zcoll"])
    ratios = [a / b for a, b in zip(res["mpi"], res["zcoll"])]
    rounded = np.round(ratios, 2).tolist()
    print(
        f"{sys.argv[1]} MiB: mpi {m * 1e6:.0f} zcoll {z * 1e6:.0f} us, ratio {m / z:.2f} {rounded}"
    )
