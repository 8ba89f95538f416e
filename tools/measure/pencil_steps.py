"""mpi4py-fft's Pencil step (Subcomm, Pencil, pencil(0), transfer, one forward and backward,
destroy) on zcoll.fft, 16x17x18 float64, broken into its parts: medians over the steps, us,
one column per rank. Parts inside the first forward and backward are timed by wrapping
zcoll.fft.pencil's functions.

    mpiexec -n 2 python pencil_steps.py [steps]
"""

import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

from zcoll import _context
from zcoll.fft import pencil as pm

comm = MPI.COMM_WORLD
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
times: dict[str, list[float]] = {}
now = time.perf_counter_ns


def record(name: str, since: int) -> int:
    times.setdefault(name, []).append((now() - since) / 1e3)
    return now()


def timed(owner, attribute: str, name: str) -> None:
    wrapped = getattr(owner, attribute)

    def timing(*args, **kwargs):
        start = now()
        result = wrapped(*args, **kwargs)
        record(name, start)
        return result

    setattr(owner, attribute, timing)


timed(_context, "Context", "context (in the first forward)")
timed(pm, "arena_arrays", "work arrays, with the context")
timed(pm.Transfer, "_init", "plan with an agreement")
timed(pm.TransferPlan, "reversed", "reversed plan")
timed(pm.TransferPlan, "run", "plan run")
shape, dtype = (16, 17, 18), np.dtype(float)


def step() -> None:
    comm.Barrier()
    t = now()
    sub = pm.Subcomm(comm, 2)
    t = record("Subcomm", t)
    aligned = pm.Pencil(sub, shape)
    other = aligned.pencil(0)
    transfer = aligned.transfer(other, dtype)
    t = record("Pencil, pencil(0), transfer()", t)
    a = np.zeros(aligned.subshape, dtype)
    b = np.zeros(other.subshape, dtype)
    comm.Barrier()
    t = now()
    transfer.forward(a, b)
    t = record("first forward", t)
    transfer.backward(b, a)
    record("first backward", t)
    comm.Barrier()
    t = now()
    transfer.destroy()
    sub.destroy()
    record("destroy both", t)


for _ in range(steps):
    step()
medians = {k: statistics.median(v[len(v) // 6 :]) for k, v in times.items()}
every = comm.gather(medians)
if comm.rank == 0:
    for name in medians:
        print(f"{name:32s}" + "".join(f"{m.get(name, 0.0):8.1f}" for m in every))
