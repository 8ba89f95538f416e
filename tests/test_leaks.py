"""Nothing leaks: no /dev/shm segment outlives a job, however it ends, and memory stays flat.

zcoll unlinks every segment name as soon as every rank has mapped it, so not even kill -9 can
leave one behind. The job tests launch their own 3-rank mpiexec jobs (so they run once, when
the suite runs alone) and compare /dev/shm before and after: a normal run, a run where a rank
raises, a run where the node leader is SIGKILLed after allocating. The last test runs in the
suite's own processes at any size: 10^5 small collectives must not grow RSS or the arena.
"""

from __future__ import annotations

import gc
import os
import re
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import zcoll
from helpers import SANITIZED, all_ranks_agree, rss_bytes
from helpers.jobs import (
    alone,
    is_open_mpi,
    job_env,
    leaked_entries,
    mpiexec,
    read_job_pids,
    run_job,
    zcoll_shm_entries,
)
from zcoll import _context

JOB_RANKS = 3


# --------------------------------------------------------------------------------------------
# Jobs that end normally, by an exception, by SIGKILL
# --------------------------------------------------------------------------------------------

LEAK_JOB = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    from mpi4py import MPI
    import zcoll
    from zcoll import _context, _core

    mode, out = sys.argv[1], sys.argv[2]
    world = MPI.COMM_WORLD
    rank, p = world.rank, world.size
    with open(os.path.join(out, f"pid.{rank}"), "w") as f:
        f.write(str(os.getpid()))
    if mode == "leak_on_purpose" and rank == 0:  # checks the checker: a name nobody unlinks
        kept = _core.SharedSegment.create(4096)
        print("KEPT", kept.name, flush=True)

    # Each rank's uncaught exception also goes to a file of its own (the ranks' stderr lines
    # interleave). Under mpiexec --enable-recovery, MPI_Finalize may wait forever for a dead
    # rank: with JOB_EXIT_ON_PEER_ERROR a survivor reports its error and leaves unfinalized.
    def report(kind, exc, tb, _default=sys.excepthook):
        with open(os.path.join(out, f"error.{rank}"), "w") as f:
            f.write(f"{kind.__name__}: {exc}")
        _default(kind, exc, tb)
        if os.environ.get("JOB_EXIT_ON_PEER_ERROR"):
            sys.stderr.flush()
            os._exit(3)
    sys.excepthook = report

    dup = world.Dup()
    halves = world.Split(rank % 2, rank)
    keep = []
    for step in range(40):
        for comm in (world, dup, halves):
            n = comm.size
            # Arena arrays of growing sizes: the arena adds segments as it fills.
            a = zcoll.empty(comm, (n, 1 + 997 * step), np.float64)
            a[:] = rank
            if step % 3 == 0:
                keep.append(a)
            zcoll.alltoall(comm, a, zcoll.empty_like(comm, a))
            # Private buffers: staged through the staging segment, which grows too.
            private = np.full((n, 1 + 499 * step), rank, np.int32)
            got = zcoll.alltoall(comm, private, np.empty_like(private))
            assert (got == np.array(comm.allgather(rank))[:, None]).all()
            zcoll.allgather(comm, private[0])
            zcoll.alltoall(comm, zcoll.IN_PLACE, a)
        if step == 20:
            if mode == "raise" and rank == 1:
                raise RuntimeError("rank 1 fails on purpose")
            if mode == "kill_leader" and rank == 0:
                os.kill(os.getpid(), signal.SIGKILL)
    segments = sum(_context.lookup(c).core.segment_count for c in (world, dup, halves))
    print(f"SEGMENTS rank={rank} {segments}", flush=True)
    halves.Free()
    dup.Free()
    print(f"DONE rank={rank}", flush=True)
    if mode == "leak_on_purpose":  # exit without running the segment's destructor (it unlinks)
        MPI.Finalize()
        os._exit(0)
    """
)


def run_leak_job(tmp_path: Path, mode: str, *open_mpi_options: str, python: tuple = (),
                 **env: str):  # fmt: skip
    script = tmp_path / "job.py"
    script.write_text(LEAK_JOB)
    before = zcoll_shm_entries()
    cmd = mpiexec(JOB_RANKS, *open_mpi_options) + [
        sys.executable, *python, str(script), mode, str(tmp_path)
    ]  # fmt: skip
    t0 = time.monotonic()
    proc = run_job(cmd, job_env(ZCOLL_TIMEOUT="5", **env))
    took = time.monotonic() - t0
    pids = read_job_pids(tmp_path)
    assert len(pids) == JOB_RANKS, f"only {len(pids)} ranks started:\n{proc.stdout}\n{proc.stderr}"
    return proc, before, pids, took


def ranks_reporting(tmp_path: Path, pattern: str) -> list[str]:
    """The ranks (group 1 of `pattern`) whose uncaught exception, as the job wrote it, matches."""
    reports = (re.match(pattern, r.read_text()) for r in tmp_path.glob("error.*"))
    return sorted(m.group(1) for m in reports if m)


@alone
def test_no_leak_after_a_normal_run(tmp_path):
    proc, before, pids, took = run_leak_job(tmp_path, "normal")
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    assert len(re.findall(r"DONE rank=\d", proc.stdout)) == JOB_RANKS, proc.stdout
    # Not vacuous: the job made several segments (control segments are not counted here).
    counts = [int(c) for c in re.findall(r"SEGMENTS rank=\d (\d+)", proc.stdout)]
    assert len(counts) == JOB_RANKS and min(counts) >= 3, proc.stdout
    assert not leaked_entries(before, pids), f"left in /dev/shm: {leaked_entries(before, pids)}"


@alone
@pytest.mark.parametrize("launch", ["python", "python_m_mpi4py"])
def test_no_leak_when_a_rank_raises(tmp_path, launch):
    """Rank 1 dies of an uncaught exception mid-run. Run as `python job.py`, it then waits in
    MPI_Finalize, having announced its departure: its peers raise PeerError saying it left, and
    the job ends; run as `python -m mpi4py job.py`, it calls MPI_Abort and mpiexec tears the
    job down."""
    python = ("-m", "mpi4py") if launch == "python_m_mpi4py" else ()
    proc, before, pids, took = run_leak_job(tmp_path, "raise", python=python)
    assert proc.returncode != 0, "the job succeeded although rank 1 raised"
    assert "rank 1 fails on purpose" in proc.stderr, proc.stderr
    assert "DONE" not in proc.stdout, proc.stdout
    if not python:
        left = r"PeerError: zcoll: rank (\d+): peer rank 1 \(pid \d+\) left on an uncaught Runtime"
        assert ranks_reporting(tmp_path, left) == ["0", "2"], proc.stderr
    assert not leaked_entries(before, pids), f"left in /dev/shm: {leaked_entries(before, pids)}"


@alone
@pytest.mark.parametrize("recovery", [False, True], ids=["abort", "enable_recovery"])
def test_no_leak_when_the_leader_is_killed(tmp_path, recovery):
    """Rank 0 -- the node leader, which creates every segment -- is SIGKILLed after allocating.
    With --enable-recovery (Open MPI) the others outlive it and run into PeerError themselves."""
    if recovery and not is_open_mpi():
        pytest.skip("--enable-recovery is an Open MPI option")
    options = ["--enable-recovery"] if recovery else []
    env = {"JOB_EXIT_ON_PEER_ERROR": "1"} if recovery else {}
    proc, before, pids, took = run_leak_job(tmp_path, "kill_leader", *options, **env)
    assert "DONE" not in proc.stdout, proc.stdout
    if recovery:
        died = r"PeerError: zcoll: rank (\d+): peer rank\(s\) 0 \(pid \d+\) died"
        assert ranks_reporting(tmp_path, died) == ["1", "2"], proc.stderr
    assert not leaked_entries(before, pids), f"left in /dev/shm: {leaked_entries(before, pids)}"


@alone
def test_leak_check_sees_a_leak(tmp_path):
    """The check above can fail: a segment whose name is never unlinked is reported."""
    proc, before, pids, took = run_leak_job(tmp_path, "leak_on_purpose")
    kept = re.search(r"KEPT /(\S+)", proc.stdout)
    assert kept, proc.stdout + proc.stderr
    try:
        assert leaked_entries(before, pids) == {kept.group(1)}
    finally:
        try:
            os.unlink(f"/dev/shm/{kept.group(1)}")
        except FileNotFoundError:
            pass


# --------------------------------------------------------------------------------------------
# Flat memory over many calls, in the suite's own processes (collective, any size)
# --------------------------------------------------------------------------------------------


def test_memory_flat_over_many_calls(world):
    """10^5 alltoalls of 8-byte blocks in arena buffers and 10^4 that allocate their result,
    after a warm-up: RSS grows by less than 2 MiB and the arena's bytes in use are unchanged."""
    p = world.size
    send = zcoll.empty(world, p, np.int64)
    recv = zcoll.empty(world, p, np.int64)
    send[:] = world.rank
    expected = np.arange(p)
    ctx = _context.lookup(world)

    def arena_calls(n: int) -> bool:
        for _ in range(n):
            zcoll.alltoall(world, send, recv)
        return bool((recv == expected).all())

    def allocating_calls(n: int) -> bool:
        ok = True
        for _ in range(n):
            ok &= bool((zcoll.alltoall(world, send) == expected).all())
        return ok

    ok = arena_calls(10_000) and allocating_calls(1_000)  # warm-up
    gc.collect()
    world.Barrier()
    rss0, in_use0 = rss_bytes(), ctx.core.arena_bytes_in_use
    t0 = time.monotonic()
    ok = arena_calls(100_000) and allocating_calls(10_000) and ok
    took = time.monotonic() - t0
    gc.collect()
    world.Barrier()
    rss1, in_use1 = rss_bytes(), ctx.core.arena_bytes_in_use
    all_ranks_agree(world, ok, "wrong results during the loop")
    grew = rss1 - rss0
    flat = SANITIZED or grew < 2 * 2**20
    all_ranks_agree(world, flat, f"RSS grew by {grew / 2**20:.2f} MiB in {took:.1f} s")
    all_ranks_agree(world, in_use1 == in_use0, f"arena bytes in use: {in_use0} -> {in_use1}")
