"""The irregular calls on plain NumPy arrays through each path zcoll may take, against the
rule ("auto") and MPI, in one launch: the counts of ``python -m zcoll.bench CALL`` for each
nominal block (neighbourhood calls on its 2-D periodic grid), medians of 11 alternating blocks
of 200 calls, largest over the ranks, us per call.

Paths: ``slots`` (the eager slots wherever they hold the call, else staged: cma_bytes never),
``staged`` (cma_bytes never, private slots off), ``cma`` (cma_bytes 0: pulled beyond the eager
size).

``--fresh``: each rank rewrites its send buffer before every call (the same for every
variant), as a program computing its data does: a send buffer left unchanged stays in the
receiver's cache between the calls of the plain loop, which flatters pulls.
``alltoall`` and ``allgather`` take the same rule and may be named too (``block`` per pair).

    mpiexec -n P python irregular_paths.py CALL[,CALL...] [--fresh] [BLOCK ...]
"""

import sys
import time

import numpy as np
from mpi4py import MPI

import zcoll
from zcoll import _context
from zcoll.bench.vcollectives import MPI_NAMES, _specs, buffer_shapes, call_counts, displacements

NEVER = 2**62
FRESH = "--fresh" in sys.argv
world = MPI.COMM_WORLD
cart = world.Create_cart(list(MPI.Compute_dims(world.size, 2)), periods=True)


REGULAR = {"alltoall": "Alltoall", "allgather": "Allgather"}


def calls(call: str, block: int):
    comm = cart if call.startswith("neighbor") else world
    if call in REGULAR:  # `block` per pair, plain 1-D arrays
        s, r = [block] * (comm.size if call == "alltoall" else 1), [block] * comm.size
        send_shape, recv_shape = (sum(s),), (sum(r),)
    else:
        s, r = call_counts(comm, call, block)
        send_shape, recv_shape = buffer_shapes(call, block, s, r)
    rng = np.random.default_rng(comm.rank)
    zs = rng.integers(0, 256, send_shape, dtype=np.uint8)
    zr = np.zeros(recv_shape, np.uint8)
    ms, mr = zs.copy(), zr.copy()
    spec = (
        (a, b)
        if call in REGULAR
        else _specs(call, (s, displacements(s)), (r, displacements(r)), a, b)
        for a, b in ((zs, zr), (ms, mr))
    )
    zspec, mspec = spec
    fn = getattr(zcoll, call)
    mpi = getattr(comm, REGULAR.get(call) or MPI_NAMES[call])
    fn(comm, *zspec)
    mpi(*mspec)
    assert np.array_equal(zr, mr), call
    if FRESH:
        ones = np.ones_like(zs)

        def z():
            np.add(zs, ones, out=zs)
            fn(comm, *zspec)

        def m():
            np.add(ms, ones, out=ms)
            mpi(*mspec)

    else:
        z, m = (lambda: fn(comm, *zspec)), (lambda: mpi(*mspec))
    return comm, z, m, comm.allreduce(sum(r), MPI.MAX)


def per_call(comm, f, n: int = 200) -> float:
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    names = sys.argv[1].split(",")
    args = [a for a in sys.argv[2:] if a != "--fresh"]
    blocks = [int(a.rstrip("K")) << (10 if a.endswith("K") else 0) for a in args]
    for call in names:
        for block in blocks or [512, 2048, 4096, 8192, 16384]:
            comm, z, m, most = calls(call, block)
            core = _context.context(comm).core
            settings = {
                "auto": (None, True),
                "slots": (NEVER, True),
                "staged": (NEVER, False),
                "cma": (0, True),
                "mpi": (None, True),
            }
            times: dict[str, list[float]] = {k: [] for k in settings}
            for rnd in range(11):
                order = list(settings)[rnd % 5 :] + list(settings)[: rnd % 5]
                for name in order:
                    core.cma_bytes, core.private_slots = settings[name]
                    times[name].append(per_call(comm, m if name == "mpi" else z))
            core.cma_bytes, core.private_slots = None, True
            med = {k: comm.allreduce(float(np.median(v)), MPI.MAX) for k, v in times.items()}
            if world.rank == 0:
                row = " ".join(f"{k} {v:6.2f}" for k, v in med.items())
                print(f"{call:20s} {block:6d} B (max recv {most:6d}): {row}", flush=True)


main()
