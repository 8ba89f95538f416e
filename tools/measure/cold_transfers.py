"""The cold-transfer rule (auto_policy.hpp, cold_transfer_runs) against the choices it rejects:
zcoll from the first run (no run through MPI) and MPI for every run. For each N (an N^3
float64 array over a slab grid of all ranks) and each number of runs n, the time of a fresh
Subcomm's transfer: its first n runs (forward and backward in turn) and destroy(), median
over rounds, policies alternating; us per transfer, then the rule's value for that size.

    mpiexec -n 2 python tools/measure/cold_transfers.py [N,...] [n,...] [rounds] [heap]

With "heap", the arrays are made with the shared heap on (zcoll.use_shared_heap()).
"""

import contextlib
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

import zcoll
from zcoll import _core
from zcoll.fft import pencil as pm

comm = MPI.COMM_WORLD
sizes = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "8,16,32,64").split(",")]
counts = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "1,4,16,64").split(",")]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 15
heap = len(sys.argv) > 4 and sys.argv[4] == "heap"
rule = _core.cold_transfer_runs
POLICIES = {
    "zcoll from the first run": lambda b: 0,
    "rule": rule,
    "MPI always": lambda b: 10**9,
}


def one(n: int, runs: int, policy) -> float:
    _core.cold_transfer_runs = policy
    try:
        sub = pm.Subcomm(comm, 1)
        a_pencil = pm.Pencil(sub, (n, n, n), 2)
        b_pencil = a_pencil.pencil(0)
        with zcoll.use_shared_heap() if heap else contextlib.nullcontext():
            a = np.random.default_rng(0).random(a_pencil.subshape)
            b = np.zeros(b_pencil.subshape)
        comm.Barrier()
        start = time.perf_counter()
        t = a_pencil.transfer(b_pencil, float)
        for k in range(runs):
            if k % 2:
                t.backward(b, a)
            else:
                t.forward(a, b)
        t.destroy()
        took = time.perf_counter() - start
        sub.destroy()
        return took
    finally:
        _core.cold_transfer_runs = rule


results = {}
for n in sizes:
    for runs in counts:
        times = {name: [] for name in POLICIES}
        for r in range(rounds):
            order = list(POLICIES.items())
            for name, policy in order if r % 2 else order[::-1]:
                times[name].append(comm.allreduce(one(n, runs, policy), op=MPI.MAX))
        results[n, runs] = {k: statistics.median(v) * 1e6 for k, v in times.items()}
if comm.rank == 0:
    kind = "shared-heap" if heap else "plain"
    print(f"P = {comm.size}, {kind} arrays; us per transfer: first n runs + destroy")
    print(f"(median of {rounds} rounds)")
    print(
        f"{'N':>4} {'bytes/rank':>10} {'rule K':>6} {'n':>4} "
        + "".join(f"{k:>26}" for k in POLICIES)
    )
    for (n, runs), row in results.items():
        per_rank = n**3 * 8 // comm.size
        k = rule(per_rank)
        print(
            f"{n:4d} {per_rank:10d} {'all' if k > 10**6 else k:>6} {runs:4d} "
            + "".join(f"{row[k]:26.1f}" for k in POLICIES)
        )
