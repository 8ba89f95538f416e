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
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI
from run_mpi import mpiexec_command

import zcoll
from conftest import all_ranks_agree, launcher_free_env
from zcoll import _context

WORLD_SIZE = MPI.COMM_WORLD.size
alone = pytest.mark.skipif(
    WORLD_SIZE > 1, reason="launches its own mpiexec jobs: runs once, when the suite runs alone"
)
JOB_RANKS = 3
# Under tests/run_mpi.py --sanitize: ASan's allocator keeps freed memory in quarantine, so RSS
# says nothing about zcoll's leaks there (the arena's own accounting still does).
SANITIZED = bool(os.environ.get("ZCOLL_TESTS_SANITIZED"))
JOB_TIMEOUT = 90  # seconds per job


# --------------------------------------------------------------------------------------------
# Helpers shared with test_faults.py: launching jobs, reading /dev/shm
# --------------------------------------------------------------------------------------------


def mpiexec(ranks: int, *open_mpi_options: str) -> list[str]:
    try:
        return mpiexec_command(ranks, *open_mpi_options)
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


def is_open_mpi() -> bool:
    return "Open MPI" in MPI.Get_library_version()


def job_env(**extra: str) -> dict:
    """This environment without the launcher's variables (the suite itself may run under
    mpiexec -n 1, and a nested mpiexec must not think it is part of that job), plus `extra`."""
    env = launcher_free_env()
    env.pop("ZCOLL_VIRTUAL_NODE_SIZE", None)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def session_processes(sid: int) -> list[int]:
    """Pids of the live processes in session `sid` (zombies excluded)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] not in "ZX":
            found.append(int(entry))
    return found


def kill_session(sid: int) -> list[int]:
    pids = session_processes(sid)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def run_job(
    cmd: list[str],
    env: dict,
    timeout: float = JOB_TIMEOUT,
    ranks_ended: Callable[[], bool] | None = None,
) -> subprocess.CompletedProcess:
    """Runs an mpiexec job in a session of its own. Fails the test if it outlives `timeout`, or
    leaves processes behind; either way every process of the job is SIGKILLed first (the ranks
    are in their own process groups, but in mpiexec's session).

    With `ranks_ended`, the job also ends once that says every rank has ended: Open MPI 4.1's
    mpiexec with --enable-recovery never returns when ranks under another host's daemon exit
    with an error (emulated nodes; a plain script shows it too), so its daemons are ended
    then."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            out, err = proc.communicate(timeout=max(left, 0) if ranks_ended is None else 0.5)
            break
        except subprocess.TimeoutExpired:
            if ranks_ended is not None and ranks_ended():
                kill_session(proc.pid)
                out, err = proc.communicate()
                return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
            if left <= 0:
                kill_session(proc.pid)
                out, err = proc.communicate()
                pytest.fail(f"the job did not end within {timeout} s:\n{out}\n{err}")
    deadline = time.monotonic() + 10
    while session_processes(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = kill_session(proc.pid)
    assert not left, f"mpiexec exited but left processes {left} running:\n{out}\n{err}"
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def zcoll_shm_entries() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith("zcoll")}


def creator_pid(entry: str) -> int | None:
    """zcoll-<uid>-<pid>-<counter>-<salt> -> pid."""
    parts = entry.split("-")
    return int(parts[2]) if len(parts) >= 3 and parts[2].isdigit() else None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def leaked_entries(before: set[str], job_pids: set[int]) -> set[str]:
    """zcoll entries new since `before` that a job process created, or whose creator is gone
    (nobody will unlink those). New entries of other live processes -- other test jobs running
    at the same time, between creating a segment and unlinking it -- do not count."""
    leaked = set()
    for entry in zcoll_shm_entries() - before:
        pid = creator_pid(entry)
        if pid is None or pid in job_pids or not pid_alive(pid):
            leaked.add(entry)
    return leaked


def read_job_pids(directory: Path) -> set[int]:
    """Pids the job's ranks wrote to `directory`/pid.<rank>."""
    return {int(f.read_text()) for f in directory.glob("pid.*")}


def job_ranks_ended(directory: Path, ranks: int) -> Callable[[], bool]:
    """True once all `ranks` ranks wrote their pid to `directory` and none of them runs any
    more (gone, or a zombie its daemon has not reaped)."""

    def ended() -> bool:
        pids = read_job_pids(directory)
        return len(pids) == ranks and not any(process_running(pid) for pid in pids)

    return ended


def process_running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return pid_alive(pid)  # no procfs entry to read: ask the kernel
    return state not in ("Z", "X")


_KILLING_JOB = """
import os, signal, sys
import numpy as np
from mpi4py import MPI
import zcoll

comm = MPI.COMM_WORLD
rank, p = comm.rank, comm.size
victim, out = int(sys.argv[1]), sys.argv[2]
with open(os.path.join(out, f"pid.{{rank}}"), "w") as f:
    f.write(str(os.getpid()))
{setup}
i = -1
try:
    for i in range({iterations}):
        if i == {kill_at} and rank == victim:
            os.kill(os.getpid(), signal.SIGKILL)
{step}
except zcoll.PeerError as exc:
    os.write(1, f"<<PEERERROR rank={{rank}} iteration={{i}} {{exc}}>>".encode())
    # Leave without MPI_Finalize: under --enable-recovery it may wait forever for the dead.
    os._exit(3)
os.write(1, f"<<DONE rank={{rank}}>>".encode())
"""


def killing_job(setup: str, step: str, iterations: int, kill_at: int) -> str:
    """The script of a job whose rank argv[1] SIGKILLs itself at iteration `kill_at` of a loop
    of `step` (after `setup`); survivors print their PeerError, or DONE after the loop."""
    return _KILLING_JOB.format(
        setup=textwrap.dedent(setup).strip(),
        step=textwrap.indent(textwrap.dedent(step).strip(), " " * 8),
        iterations=iterations,
        kill_at=kill_at,
    )


def run_clean_job(tmp_path: Path, script: str, ranks: int, args: list[str], timeout_s: str,
                  *open_mpi_options: str) -> tuple[subprocess.CompletedProcess, float]:  # fmt: skip
    """Runs `script` (its pid.<rank> files written to argv's tmp_path) on `ranks` ranks with
    ZCOLL_TIMEOUT=`timeout_s`; asserts that every rank started and that no zcoll segment of the
    job is left in /dev/shm. Returns the finished job and its wall time."""
    path = tmp_path / "job.py"
    path.write_text(script)
    cmd = mpiexec(ranks, *open_mpi_options) + [sys.executable, str(path), *args]
    before = zcoll_shm_entries()
    t0 = time.monotonic()
    proc = run_job(cmd, job_env(ZCOLL_TIMEOUT=timeout_s), timeout=60)
    took = time.monotonic() - t0
    pids = read_job_pids(tmp_path)
    assert len(pids) == ranks, f"only {len(pids)} ranks started:\n{proc.stdout}\n{proc.stderr}"
    assert not leaked_entries(before, pids), f"left in /dev/shm: {leaked_entries(before, pids)}"
    return proc, took


def check_job_with_killed_rank(tmp_path: Path, script: str, victim: int) -> None:
    """Runs `script` (see killing_job) on 3 ranks with `victim` killed: the job ends within
    the 30 s zcoll timeout (death noticed, not a timeout), no segment of it is left in
    /dev/shm, no rank finishes the loop, and under Open MPI (--enable-recovery) both survivors
    report that the victim died."""
    recovery = is_open_mpi()
    options = ["--enable-recovery"] if recovery else []
    proc, took = run_clean_job(tmp_path, script, 3, [str(victim), str(tmp_path)], "30", *options)
    assert "<<DONE" not in proc.stdout, "a rank finished the loop although a peer died"
    assert took < 30, f"the job took {took:.1f} s: was the death noticed, or the timeout?"
    if recovery:
        report = r"<<PEERERROR rank=(\d+) iteration=\d+ (.*?)>>"
        reports = dict(re.findall(report, proc.stdout, re.S))
        survivors = {str(r) for r in range(3) if r != victim}
        assert set(reports) == survivors, (
            f"survivors that reported: {sorted(reports)}\n{proc.stdout}\n{proc.stderr}"
        )
        for message in reports.values():
            assert re.search(rf"peer rank\(s\) {victim} \(pid \d+\) died", message), message


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


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


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
