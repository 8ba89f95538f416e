"""The first collectives on a fresh communicator (a Subcomm's, as a Pencil step makes): an
agreement of each kind (Iallreduce, Iallgather, Ialltoall, Ibarrier, a blocking Allreduce, or
none), then the Transfer's Ialltoallw twice, 16x17x18 float64; medians over the steps, each
rank's column, us.

    mpiexec -n 2 python first_collectives.py
"""

import statistics
import time

import mpi4py_fft.pencil as mp
import numpy as np
from mpi4py import MPI

from zcoll.fft import _mpi_runs as mr

comm = MPI.COMM_WORLD
now = time.perf_counter_ns
T = {}


def rec(n, t):
    T.setdefault(n, []).append((now() - t) / 1e3)
    return now()


shape, dtype = (16, 17, 18), np.dtype(float)


def wait(r):
    while not r.Test():
        pass


for it in range(500):
    vs = ["Iallreduce", "Iallgather", "Ialltoall", "Ibarrier", "none", "Allreduce"]
    if it % 2:
        vs.reverse()
    for v in vs:
        sub = mp.Subcomm(comm, 2)
        al = mp.Pencil(sub, shape)
        ot = al.pencil(0)
        tr = al.transfer(ot, dtype)
        a = np.zeros(al.subshape, dtype)
        b = np.zeros(ot.subshape, dtype)
        c = tr.comm
        p = c.size
        mine = mr.MpiRuns(
            c, dtype, shape, (tuple(al.subshape), tuple(ot.subshape)), (tr.axisA, tr.axisB)
        )
        sides = mine._side(0)
        f1, f2 = np.ones(p, np.int32), np.zeros(p, np.int32)
        comm.Barrier()
        t = now()
        if v == "Iallreduce":
            wait(c.Iallreduce(f1[:1], f2[:1], op=MPI.MIN))
        elif v == "Iallgather":
            wait(c.Iallgather(f1[:1], f2))
        elif v == "Ialltoall":
            wait(c.Ialltoall(f1, f2))
        elif v == "Ibarrier":
            wait(c.Ibarrier())
        elif v == "Allreduce":
            c.Allreduce(f1[:1], f2[:1], op=MPI.MIN)
        t = rec(v + " agree", t)
        wait(c.Ialltoallw((a, *sides[0]), (b, *sides[1])))
        t = rec(v + " then a2aw", t)
        wait(c.Ialltoallw((b, *sides[1]), (a, *sides[0])))
        t = rec(v + " then 2nd a2aw", t)
        tr.destroy()
        sub.destroy()
med = {k: statistics.median(v[80:]) for k, v in T.items()}
every = comm.gather(med)
if comm.rank == 0:
    for k in sorted(med):
        print(f"{k:28s}", " ".join(f"{e[k]:7.1f}" for e in every))
