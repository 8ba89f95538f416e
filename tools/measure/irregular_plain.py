"""alltoallv and a neighbour alltoall (1-D periodic grid) on plain NumPy arrays, each rank
receiving `sizes` bytes: zcoll against MPI in one launch (medians of 15 alternating blocks of
200 calls; largest over the ranks), or with --paths zcoll's eager path against its CMA pull
(cma_bytes 0) on the same arrays.

    mpiexec -n 2 python irregular_plain.py [--paths] [bytes ...]
"""

import sys
import time

import numpy as np
from mpi4py import MPI

import zcoll
from zcoll import _context

comm = MPI.COMM_WORLD
p = comm.size
cart = comm.Create_cart([p], periods=[True])
paths = "--paths" in sys.argv
sizes = [int(a) for a in sys.argv[1:] if a != "--paths"] or [2048, 6144, 8192, 12288]


def per_call(f, n: int = 200) -> float:
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - start) / n * 1e6


def compare(variants: dict, setup) -> dict[str, float]:
    """Median us per call of each variant, alternating; `setup(name)` runs before each block."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for f in variants.values():
        for _ in range(200):
            f()
    for _ in range(15):
        for name, f in variants.items():
            setup(name)
            times[name].append(per_call(f))
    return {k: comm.allreduce(float(np.median(v)), op=MPI.MAX) for k, v in times.items()}


def calls(received: int) -> dict:
    """name -> (communicator, zcoll's call, MPI's call), each rank receiving `received` B."""
    count = received // (8 * p)
    send = np.random.default_rng(comm.rank).random(p * count)
    recv = np.empty_like(send)
    counts = [count] * p
    ns = np.random.default_rng(comm.rank).random(received // 8)
    nr = np.empty_like(ns)
    return {
        "alltoallv": (
            comm,
            lambda: zcoll.alltoallv(comm, [send, counts], [recv, counts]),
            lambda: comm.Alltoallv([send, counts], [recv, counts]),
        ),
        "neighbor": (
            cart,
            lambda: zcoll.neighbor_alltoall(cart, ns, nr),
            lambda: cart.Neighbor_alltoall(ns, nr),
        ),
    }


out = []
for received in sizes:
    for name, (c, z, m) in calls(received).items():
        core = _context.context(c).core
        measured = core.cma_bytes
        if paths:

            def setup(variant: str, core=core, measured=measured) -> None:
                core.cma_bytes = 0 if variant == "cma" else measured

            t = compare({"eager": z, "cma": z}, setup)
            core.cma_bytes = measured
            out.append(f"{name} {received >> 10}K: eager {t['eager']:.2f} cma {t['cma']:.2f}")
        else:
            t = compare({"zcoll": z, "mpi": m}, lambda _: None)
            ratio = t["mpi"] / t["zcoll"]
            kib = received >> 10
            out.append(f"{name} {kib}K: {t['zcoll']:.2f} MPI {t['mpi']:.2f} {ratio:.2f}x")
if comm.rank == 0:
    print(" | ".join(out))
