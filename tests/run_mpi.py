#!/usr/bin/env python3
"""Run zcoll's test suite under mpiexec at several communicator sizes.

    python tests/run_mpi.py                 # P = 1 2 3 4 5 8, then virtual nodes
    python tests/run_mpi.py -n 2 4 -- -k alltoall
    python tests/run_mpi.py --sanitize      # P = 2 with the extension under ASan + UBSan

Each size runs `python -m pytest` on every rank under mpiexec, with a wall-clock limit so a
stuck job cannot hang CI. Rank 0's output is shown; the other ranks write logs that are shown
when their run fails. Per-rank JUnit XML files are combined into one verdict: a test fails when
it fails on any rank. The last line is "N passed, N failed, N skipped".

--sanitize first installs zcoll, built with -DZCOLL_SANITIZE=address,undefined (its own build
directory, build/sanitize/), into the venv build/sanitize-venv (which sees this Python's
packages), then runs the suite there at P = 2 (or -n) with the sanitizers' runtimes preloaded
into the ranks, as AddressSanitizer's documentation describes for a sanitized extension of an
uninstrumented interpreter. Leak detection is off (the interpreter keeps objects to the end by
design); any other report aborts its rank, which fails the run.
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


SANITIZERS = "address,undefined"
SANITIZER_OPTIONS = {
    "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
    # Tests whose measure the sanitizer's allocator changes (RSS: ASan's quarantine holds freed
    # memory) check everything else (test_leaks.SANITIZED).
    "ZCOLL_TESTS_SANITIZED": "1",
}


def sanitized_python() -> tuple[str, list[str]]:
    """The venv's Python with zcoll built under the sanitizers, and the command prefix that
    preloads their runtimes into a rank."""
    root = HERE.parent
    venv = root / "build" / "sanitize-venv"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                       check=True)  # fmt: skip
    print(f"===== installing zcoll with -fsanitize={SANITIZERS} into {venv}", flush=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(root),
         f"-Ccmake.define.ZCOLL_SANITIZE={SANITIZERS}", "-Cbuild-dir=build/sanitize/{wheel_tag}"],
        check=True,
    )  # fmt: skip
    runtimes = []
    for lib in ("libasan.so", "libubsan.so"):
        path = subprocess.run(["c++", f"-print-file-name={lib}"], capture_output=True,
                              text=True).stdout.strip()  # fmt: skip
        runtimes.append(path)
    preload = ["env", f"LD_PRELOAD={' '.join(runtimes)}"]
    preload += [f"{k}={v}" for k, v in SANITIZER_OPTIONS.items()]
    return str(python), preload


def run_size(ranks: int, env_extra: dict, pytest_args: list[str], out: Path, limit: float,
             python: str = sys.executable, prefix: tuple[str, ...] = ()) -> int:  # fmt: skip
    env = dict(os.environ, **env_extra)
    env["ZCOLL_TEST_RESULTS"] = str(out)
    env.setdefault("PYTHONUNBUFFERED", "1")
    try:
        cmd = mpiexec_command(ranks) + [*prefix, python, str(HERE / "rank_main.py"), *pytest_args]
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
    parser.add_argument("-n", "--ranks", type=int, nargs="+")
    parser.add_argument("--no-virtual-nodes", action="store_true")
    parser.add_argument(
        "--sanitize",
        action="store_true",
        help=f"the extension built with -fsanitize={SANITIZERS}; P = 2 unless -n",
    )
    parser.add_argument("--limit", type=float, default=1500, help="seconds per mpiexec run")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = parser.parse_args()
    python, prefix = sys.executable, []
    if args.sanitize:
        python, prefix = sanitized_python()
    ranks_default = [2] if args.sanitize else [1, 2, 3, 4, 5, 8]
    runs = [(p, {}) for p in (args.ranks or ranks_default)]
    if not args.no_virtual_nodes and not args.sanitize:
        runs += VIRTUAL_NODE_RUNS
    totals = {"passed": 0, "failed": 0, "skipped": 0}
    bad_runs = []
    for ranks, env_extra in runs:
        with tempfile.TemporaryDirectory(prefix="zcoll-tests-") as tmp:
            out = Path(tmp)
            code = run_size(ranks, env_extra, args.pytest_args, out, args.limit, python, prefix)
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
