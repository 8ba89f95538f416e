#!/usr/bin/env python3
"""Run zcoll's test suite under mpiexec at several communicator sizes.

    python tests/run_mpi.py                 # P = 1 2 3 4 5 8, then virtual nodes
    python tests/run_mpi.py -n 2 4 -- -k alltoall

Each size runs `python -m pytest` on every rank under mpiexec, with a wall-clock limit so a
stuck job cannot hang CI. Rank 0's output is shown; the other ranks write logs that are shown
when their run fails. Per-rank JUnit XML files are combined into one verdict: a test fails when
it fails on any rank. The last line is "N passed, N failed, N skipped".
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent

# Extra runs: (ranks, environment) -- virtual nodes exercise the multi-node path for real.
VIRTUAL_NODE_RUNS = [(4, {"ZCOLL_VIRTUAL_NODE_SIZE": "2"}), (5, {"ZCOLL_VIRTUAL_NODE_SIZE": "2"})]


def mpiexec_command(ranks: int, *open_mpi_options: str) -> list[str]:
    """mpiexec for `ranks` ranks; with Open MPI also oversubscription, root and the options.

    Raises FileNotFoundError when there is no mpiexec on PATH."""
    exe = shutil.which("mpiexec") or shutil.which("mpirun")
    if exe is None:
        raise FileNotFoundError("no mpiexec on PATH (install openmpi-bin or mpich)")
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    cmd = [exe]
    if "Open MPI" in version or "OpenRTE" in version:
        cmd += ["--oversubscribe", *open_mpi_options]
        if os.geteuid() == 0:
            cmd += ["--allow-run-as-root"]
    return [*cmd, "-n", str(ranks)]


def run_size(ranks: int, env_extra: dict, pytest_args: list[str], out: Path, limit: float) -> int:
    env = dict(os.environ, **env_extra)
    env["ZCOLL_TEST_RESULTS"] = str(out)
    env.setdefault("PYTHONUNBUFFERED", "1")
    try:
        cmd = mpiexec_command(ranks) + [sys.executable, str(HERE / "rank_main.py"), *pytest_args]
    except FileNotFoundError as exc:
        sys.exit(f"run_mpi.py: {exc}")
    label = f"P={ranks}" + "".join(f" {k}={v}" for k, v in env_extra.items())
    print(f"\n===== {label}: {' '.join(cmd)}", flush=True)
    try:
        return subprocess.run(cmd, env=env, timeout=limit).returncode
    except subprocess.TimeoutExpired:
        print(f"===== {label}: killed after {limit:.0f} s", flush=True)
        return 124


def tally(out: Path) -> dict[str, str]:
    """Outcome of every test over all ranks: failed > passed > skipped."""
    rank_of = {"failed": 3, "passed": 2, "skipped": 1}
    verdict: dict[str, str] = {}
    for xml in out.glob("rank*.xml"):
        for case in ET.parse(xml).getroot().iter("testcase"):
            name = f"{case.get('classname')}::{case.get('name')}"
            if case.find("failure") is not None or case.find("error") is not None:
                outcome = "failed"
            elif case.find("skipped") is not None:
                outcome = "skipped"
            else:
                outcome = "passed"
            if rank_of[outcome] > rank_of.get(verdict.get(name, ""), 0):
                verdict[name] = outcome
    return verdict


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("-n", "--ranks", type=int, nargs="+", default=[1, 2, 3, 4, 5, 8])
    parser.add_argument("--no-virtual-nodes", action="store_true")
    parser.add_argument("--limit", type=float, default=1500, help="seconds per mpiexec run")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = parser.parse_args()
    runs = [(p, {}) for p in args.ranks]
    if not args.no_virtual_nodes:
        runs += VIRTUAL_NODE_RUNS
    totals = {"passed": 0, "failed": 0, "skipped": 0}
    bad_runs = []
    for ranks, env_extra in runs:
        with tempfile.TemporaryDirectory(prefix="zcoll-tests-") as tmp:
            out = Path(tmp)
            code = run_size(ranks, env_extra, args.pytest_args, out, args.limit)
            verdict = tally(out)
            counts = {k: sum(v == k for v in verdict.values()) for k in totals}
            for k in totals:
                totals[k] += counts[k]
            failed = [name for name, v in verdict.items() if v == "failed"]
            if code != 0 or failed or not verdict:
                bad_runs.append((ranks, env_extra, code))
                for name in failed:
                    print(f"FAILED (on some rank) {name}")
                for log in sorted(out.glob("rank*.log")):
                    text = log.read_text(errors="replace")
                    if "FAILED" in text or "Error" in text or code != 0:
                        print(f"----- {log.name} (last 60 lines)")
                        print("\n".join(text.splitlines()[-60:]))
            print(f"===== P={ranks} {env_extra or ''}: exit {code}, {counts}", flush=True)
    for ranks, env_extra, code in bad_runs:
        print(f"run P={ranks} {env_extra or ''} failed (exit {code})")
    failed = totals["failed"] + (1 if bad_runs and not totals["failed"] else 0)
    print(f"{totals['passed']} passed, {failed} failed, {totals['skipped']} skipped")
    return 1 if bad_runs or totals["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
