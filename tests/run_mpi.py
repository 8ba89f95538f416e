#!/usr/bin/env python3
"""Run zcoll's test suite under mpiexec at several communicator sizes.

    python tests/run_mpi.py                 # P = 1 2 3 4 5 8, then virtual and emulated nodes
    python tests/run_mpi.py -n 2 4 -- -k alltoall
    python tests/run_mpi.py --sanitize      # P = 2 with the extension under ASan + UBSan
    python tests/run_mpi.py --nodes-only    # only the virtual and emulated nodes' runs

The multi-node path runs on virtual nodes (ZCOLL_VIRTUAL_NODE_SIZE: cuts of this machine's
node) and, with Open MPI, on a cluster emulated on this machine (tools/emulated-nodes/rsh-agent:
nodes of MPI's own, TCP between them), where zcoll finds its nodes as on a real cluster.

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
import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent

# Extra runs: (ranks, environment) -- virtual nodes exercise the multi-node path for real.
VIRTUAL_NODES_OF_2 = {"ZCOLL_VIRTUAL_NODE_SIZE": "2"}
VIRTUAL_NODE_RUNS = [(5, VIRTUAL_NODES_OF_2)]
# Runs on a cluster emulated on this machine: MPI's own nodes (shared memory within one, TCP
# between them), as zcoll finds them on a real cluster. Open MPI only; where emulated nodes
# cannot run, the same ranks on virtual nodes of 2 run instead (with Open MPI, the P = 5 run
# above covers the rest of the suite on virtual nodes). Every message between nodes crosses
# the kernel's TCP stack, which makes a call several times slower than on virtual nodes.
# Without pytest arguments these runs take what emulated nodes add to virtual ones: nodes found
# as MPI reports them, the oversubscription counted per machine, MPI's messages between real
# nodes and a peer lost there -- the collectives themselves with order "auto" (the other block
# orders only change a node's own schedule, tested in every other run), the multi-node
# machinery, faults and settings. The reductions' protocol between nodes is the same code as on
# virtual nodes (the P = 5 run; its kill tests run on emulated nodes too, test_across_nodes).
# The whole suite passes there too, in ~11 min on the 2-core VM.
EMULATED_NODE_RUNS = [(2, 2)]
EMULATED_NODE_MODULES = [
    "test_collectives.py",
    "test_internode.py",
    "test_faults.py",
    "test_settings.py",
]
# (Plain buffers' CMA and staging paths are node-local: the runs on one node test them.)
EMULATED_NODE_SELECTION = [
    "-k",
    "not row and not column and not hilbert and not morton and not private_buffers "
    "and not refused_cma and not pulled_by_cma",
]
RSH_AGENT = HERE.parent / "tools" / "emulated-nodes" / "rsh-agent"
# Modules whose tests do not communicate (serial FFT backends, block schedules, copy kernels,
# the import graph): the same at every P, so they run in the runs of one and two ranks on one
# node, and no other (every further run would only repeat them).
RANK_COUNT_FREE_MODULES = [
    "test_heap_process.py",
    "fft/test_libfft.py",
    "fft/test_fftw.py",
    "test_schedule.py",
    "test_copy.py",
    "test_imports.py",
]
# Modules of the command-line tools (bench): their cases run at P = 2 and on virtual nodes
# (--between-nodes needs several); the collectives they time are tested at every P by the
# collectives' own modules.
TOOL_MODULES = ["bench/test_bench.py"]
# zcoll.fft's mpi4py-fft semantics (layouts, object model, the same values as mpi4py-fft): not
# in the virtual-node run, where their data would move by the Transfers that test_fft.py
# checks on those nodes.
FFT_SEMANTICS_MODULES = [
    "fft/test_mpifft.py",
    "fft/test_pencil.py",
    "fft/test_darray.py",
    "fft/test_mpi4py_fft_parity.py",
]


def launcher() -> str | None:
    """The MPI launcher: $ZCOLL_MPIEXEC (e.g. mpiexec.mpich, for the MPI mpi4py runs on when
    another one's mpiexec comes first on PATH), else mpiexec or mpirun on PATH."""
    named = os.environ.get("ZCOLL_MPIEXEC")
    if named:
        return shutil.which(named)
    return shutil.which("mpiexec") or shutil.which("mpirun")


def mpiexec_command(ranks: int, *open_mpi_options: str) -> list[str]:
    """mpiexec for `ranks` ranks; with Open MPI also oversubscription, root and the options.

    Raises FileNotFoundError when there is no mpiexec on PATH."""
    exe = launcher()
    if exe is None:
        raise FileNotFoundError("no mpiexec on PATH (install openmpi-bin or mpich)")
    cmd = [exe]
    if is_open_mpi(exe):
        cmd += ["--oversubscribe", *open_mpi_options]
        if os.geteuid() == 0:
            cmd += ["--allow-run-as-root"]
    return [*cmd, "-n", str(ranks)]


def is_open_mpi(exe: str) -> bool:
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    return "Open MPI" in version or "OpenRTE" in version


def emulated_cluster(node_sizes: tuple[int, ...]) -> list[str] | None:
    """Open MPI's options for nodes of `node_sizes` ranks emulated on this machine (the first
    is this host; tools/emulated-nodes/rsh-agent starts the others' daemons here, each in a
    UTS namespace named after its host), or None where that cannot work: no Open MPI, or no
    namespace for the agent."""
    exe = launcher()
    if exe is None or not is_open_mpi(exe) or shutil.which("unshare") is None:
        return None
    probe = (
        ["unshare", "--uts", "true"] if os.geteuid() == 0 else ["unshare", "-r", "--uts", "true"]
    )
    if subprocess.run(probe, capture_output=True).returncode != 0:
        return None
    names = [socket.gethostname()] + [f"zcoll-node-{i}" for i in range(1, len(node_sizes))]
    hosts = ",".join(f"{name}:{size}" for name, size in zip(names, node_sizes))
    return ["--host", hosts, "--mca", "plm_rsh_agent", str(RSH_AGENT)]


SANITIZERS = "address,undefined"
SANITIZER_OPTIONS = {
    "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
    # Tests whose measure the sanitizer's allocator changes (RSS: ASan's quarantine holds freed
    # memory) check everything else (helpers.SANITIZED).
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


@dataclasses.dataclass(frozen=True)
class Run:
    """One mpiexec job of the suite: `ranks` ranks with `env` added, on emulated nodes of
    `nodes` ranks each where given."""

    ranks: int
    env: dict = dataclasses.field(default_factory=dict)
    nodes: tuple[int, ...] = ()

    @property
    def label(self) -> str:
        where = f" on emulated nodes {'+'.join(map(str, self.nodes))}" if self.nodes else ""
        return f"P={self.ranks}{where}" + "".join(f" {k}={v}" for k, v in self.env.items())


def run_size(run: Run, pytest_args: list[str], out: Path, limit: float,
             python: str = sys.executable, prefix: tuple[str, ...] = (),
             cluster: list[str] | None = None) -> int:  # fmt: skip
    env = dict(os.environ, **run.env)
    env["ZCOLL_TEST_RESULTS"] = str(out)
    env.setdefault("PYTHONUNBUFFERED", "1")
    try:
        cmd = mpiexec_command(run.ranks, *(cluster or ()))
    except FileNotFoundError as exc:
        sys.exit(f"run_mpi.py: {exc}")
    cmd += [*prefix, python, str(HERE / "rank_main.py"), *pytest_args]
    print(f"\n===== {run.label}: {' '.join(cmd)}", flush=True)
    try:
        return subprocess.run(cmd, env=env, timeout=limit).returncode
    except subprocess.TimeoutExpired:
        print(f"===== {run.label}: killed after {limit:.0f} s", flush=True)
        return 124


def default_selection(run: Run) -> list[str]:
    """pytest's arguments for `run` when none were given: the emulated nodes' modules, else the
    whole suite less what another run already covers (the module lists above)."""
    if run.nodes:
        return [str(HERE / module) for module in EMULATED_NODE_MODULES] + EMULATED_NODE_SELECTION
    if run.ranks == 2 and not run.env:
        return []
    if run.ranks == 1:
        left_out = TOOL_MODULES
    elif run.env:
        left_out = RANK_COUNT_FREE_MODULES + FFT_SEMANTICS_MODULES
    else:
        left_out = RANK_COUNT_FREE_MODULES + TOOL_MODULES
    return [f"--ignore={HERE / module}" for module in left_out]


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
    parser.add_argument(
        "--no-virtual-nodes",
        action="store_true",
        help="no runs on virtual nodes (ZCOLL_VIRTUAL_NODE_SIZE) or emulated nodes",
    )
    parser.add_argument(
        "--nodes-only",
        action="store_true",
        help="only the runs on virtual and emulated nodes",
    )
    parser.add_argument(
        "--sanitize",
        action="store_true",
        help=f"the extension built with -fsanitize={SANITIZERS}; P = 2 unless -n",
    )
    parser.add_argument("--limit", type=float, default=1500, help="seconds per mpiexec run")
    parser.add_argument(
        "--keep", type=Path, help="keep each run's JUnit XML and rank logs in KEEP/<run>"
    )
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = parser.parse_args()
    python, prefix = sys.executable, []
    if args.sanitize:
        python, prefix = sanitized_python()
    ranks_default = [2] if args.sanitize else [1, 2, 3, 4, 5, 8]
    runs = [] if args.nodes_only else [Run(p) for p in args.ranks or ranks_default]
    if not args.no_virtual_nodes and not args.sanitize:
        runs += [Run(p, env) for p, env in VIRTUAL_NODE_RUNS]
        runs += [Run(sum(nodes), nodes=nodes) for nodes in EMULATED_NODE_RUNS]
    totals = {"passed": 0, "failed": 0, "skipped": 0}
    bad_runs = []
    for run in runs:
        cluster = emulated_cluster(run.nodes) if run.nodes else None
        if run.nodes and cluster is None:
            instead = Run(run.ranks, VIRTUAL_NODES_OF_2)
            print(f"\n===== {run.label}: needs Open MPI and unshare; {instead.label} instead")
            run = instead
        with tempfile.TemporaryDirectory(prefix="zcoll-tests-") as tmp:
            out = Path(tmp)
            pytest_args = default_selection(run) if not args.pytest_args else args.pytest_args
            started = time.monotonic()
            code = run_size(run, pytest_args, out, args.limit, python, prefix, cluster)
            seconds = time.monotonic() - started
            if args.keep:  # each run's JUnit files and logs, e.g. for per-module times
                shutil.copytree(out, args.keep / run.label.replace(" ", "_"), dirs_exist_ok=True)
            verdict = tally(out)
            counts = {k: sum(v == k for v in verdict.values()) for k in totals}
            for k in totals:
                totals[k] += counts[k]
            failed = [name for name, v in verdict.items() if v == "failed"]
            if code != 0 or failed or not verdict:
                bad_runs.append((run, code))
                for name in failed:
                    print(f"FAILED (on some rank) {name}")
                for log in sorted(out.glob("rank*.log")):
                    text = log.read_text(errors="replace")
                    if "FAILED" in text or "Error" in text or code != 0:
                        print(f"----- {log.name} (last 60 lines)")
                        print("\n".join(text.splitlines()[-60:]))
            print(f"===== {run.label}: exit {code}, {counts} in {seconds:.1f} s", flush=True)
    for run, code in bad_runs:
        print(f"run {run.label} failed (exit {code})")
    failed = totals["failed"] + (1 if bad_runs and not totals["failed"] else 0)
    print(f"{totals['passed']} passed, {failed} failed, {totals['skipped']} skipped")
    return 1 if bad_runs or totals["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
