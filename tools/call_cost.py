"""Where the time of one 8-byte zcoll.alltoall goes (COMM_SELF, one process).

    python tools/call_cost.py

CPU time (time.process_time, robust to other load) per call, best of 9 x 30000 calls, with the
cost of the timing loop's own lambda call subtracted.
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

import zcoll
from zcoll import _collectives, _context, _core
from zcoll._context import lookup


def best(fn, calls: int = 30_000, repeats: int = 9) -> float:
    times = []
    for _ in range(repeats):
        start = time.process_time()
        for _ in range(calls):
            fn()
        times.append((time.process_time() - start) / calls * 1e9)
    return min(times)


def main() -> None:
    comm = MPI.COMM_SELF
    send = zcoll.empty(comm, (1, 1), np.float64)
    recv = zcoll.empty(comm, (1, 1), np.float64)
    ctx = lookup(comm)
    engine = ctx.core.alltoall
    code = _collectives._ALLTOALL_CODE
    fast = _core.fast_collective
    plan = zcoll.alltoall_init(comm, send, recv)
    steps = [
        ("comm.handle (mpi4py property)", lambda: comm.handle),
        ("context lookup by handle (Python dict)", lambda: _context._by_handle[comm.handle]),
        ("order name -> code (dict, type check)", lambda: _collectives.ORDER_CODES.get("auto")),
        ("NodeContext.alltoall(send, recv, -1, -1) (pybind11)", lambda: engine(send, recv, -1, -1)),
        (
            "_core.fast_collective(...) (one crossing)",
            lambda: fast(code, comm, send, recv, "auto", "auto"),
        ),
        ("zcoll.alltoall(comm, send, recv)", lambda: zcoll.alltoall(comm, send, recv)),
        ("plan()", plan),
        ("plan.start(); plan.wait()", lambda: (plan.start(), plan.wait())),
    ]
    base = best(lambda: None)
    for name, fn in steps:
        print(f"{best(fn) - base:7.0f} ns  {name}")
    plan.free()


if __name__ == "__main__":
    main()
