"""mpi4py-fft's Pencil step (Subcomm, Pencil, pencil(0), transfer(), one forward and backward,
destroy) on both libraries, 16x17x18 float64, the libraries alternating step by step: medians
over the steps of each part, the largest over the ranks, us; inside zcoll's first runs through
MPI, the agreement and the Ialltoallw with its bounded wait.

    mpiexec -n 2 python pencil_parts.py [steps]
"""

import statistics
import sys
import time

import mpi4py_fft.pencil as mp
import numpy as np
from mpi4py import MPI

from zcoll.fft import _mpi_runs as mr
from zcoll.fft import pencil as zp

comm = MPI.COMM_WORLD
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
now = time.perf_counter_ns
T = {}


def rec(lib, name, since):
    T.setdefault((lib, name), []).append((now() - since) / 1e3)
    return now()


# time zcoll's agreement and exchange inside
orig_agree, orig_ex = mr.agree_min, mr.MpiRuns.exchange


def agree(*a, **k):
    t = now()
    r = orig_agree(*a, **k)
    rec("z", "  agree", t)
    return r


def ex(self, *a, **k):
    t = now()
    r = orig_ex(self, *a, **k)
    rec("z", "  Ialltoallw+wait", t)
    return r


mr.agree_min = agree
mr.MpiRuns.exchange = ex
shape, dtype = (16, 17, 18), np.dtype(float)


def step(lib, m):
    comm.Barrier()
    t = now()
    sub = m.Subcomm(comm, 2)
    t = rec(lib, "Subcomm", t)
    al = m.Pencil(sub, shape)
    ot = al.pencil(0)
    tr = al.transfer(ot, dtype)
    t = rec(lib, "Pencil+transfer", t)
    a = np.zeros(al.subshape, dtype)
    b = np.zeros(ot.subshape, dtype)
    comm.Barrier()
    t = now()
    tr.forward(a, b)
    t = rec(lib, "forward", t)
    tr.backward(b, a)
    t = rec(lib, "backward", t)
    tr.destroy()
    sub.destroy()
    rec(lib, "destroy", t)


for i in range(steps):
    for lib, m in (("z", zp), ("m", mp)) if i % 2 else (("m", mp), ("z", zp)):
        step(lib, m)
med = {k: statistics.median(v[len(v) // 6 :]) for k, v in T.items()}
every = comm.gather(med)
if comm.rank == 0:
    names = []
    for _lib, n in med:
        if n not in names:
            names.append(n)
    tot = {"z": 0.0, "m": 0.0}
    for n in names:
        z = max(e.get(("z", n), 0) for e in every)
        mm = max(e.get(("m", n), 0) for e in every)
        if not n.startswith(" "):
            tot["z"] += z
            tot["m"] += mm
        print(f"{n:20s} zcoll {z:7.1f}  mpi4py-fft {mm:7.1f}")
    print(f"sum: zcoll {tot['z']:.1f} mpi4py-fft {tot['m']:.1f} ratio {tot['m'] / tot['z']:.3f}")
