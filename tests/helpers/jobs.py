"""Tests that launch their own mpiexec jobs: launching them, ending them, reading /dev/shm,
and the jobs whose rank is killed or leaves."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from mpi4py import MPI
from run_mpi import mpiexec_command

from helpers import launcher_free_env

WORLD_SIZE = MPI.COMM_WORLD.size
alone = pytest.mark.skipif(
    WORLD_SIZE > 1, reason="launches its own mpiexec jobs: runs once, when the suite runs alone"
)


JOB_TIMEOUT = 90  # seconds per job


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
