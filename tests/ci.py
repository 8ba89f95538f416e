#!/usr/bin/env python3
"""Staged test driver: lint, the API reference, C++ unit tests under sanitizers, the MPI test
suite on Open MPI and on MPICH.

    python3 tests/ci.py                        # lint, docs, asan, tsan, mpi, mpich (what CI runs)
    python3 tests/ci.py --stages docs          # only the API reference
    python3 tests/ci.py --stages cpp           # only the C++ unit tests, unsanitized
    python3 tests/ci.py --no-lint -- -n 2 4    # arguments after -- go to tests/run_mpi.py

Stages run in order and every selected stage runs even when an earlier one failed:

  lint  pre-commit run --all-files --show-diff-on-failure (skipped, with a note, when the
        repository has no .pre-commit-config.yaml)
  docs  the API reference from the numpydoc docstrings (docs/api/), warnings as errors:
        python -m sphinx -E -W --keep-going -b html docs/api build/docs (needs the docs extra:
        sphinx, numpydoc; it documents this checkout's python/zcoll with the installed
        extension)
  asan  configures build/cpp-asan with -DZCOLL_BUILD_TESTS=ON (needs doctest: apt install
        doctest-dev) and -DZCOLL_SANITIZE=address,undefined at -O1 (the sanitizers' advice),
        builds every C++ unit test with 2 jobs and runs them under ctest --output-on-failure:
        any AddressSanitizer, LeakSanitizer or UndefinedBehaviorSanitizer report fails its test
  tsan  the same in build/cpp-tsan with -DZCOLL_SANITIZE=thread, for the unit tests that run
        threads or forked processes as ranks (barrier, arena, call protocol, reduction,
        irregular exchange: the flags and sequence numbers): any report fails its test. The
        others run one thread, where ThreadSanitizer has nothing to see that asan does not
  mpi   python tests/run_mpi.py [arguments after --]: Open MPI, the system's default
  mpich the user's install on MPICH (stage_mpich): mpi4py built against it in a venv of its
        own, zcoll from the checkout there (both built in the background while the mpi stage
        runs, when both stages are selected), the collectives, reductions, irregular,
        neighbourhood and FFT tests at P = 2 (neighbourhood at 3; block orders other than
        "auto" only under Open MPI), one run on virtual nodes, the FFT and heat examples at
        P = 1, 2
  cpp   (not by default) the unit tests in build/cpp-tests without sanitizers: the tests asan
        runs, without its checks

Each stage prints its name and wall time. The exit status is non-zero when any stage failed.
The last line is "N passed, N failed, N skipped": ctest's test counts plus run_mpi's; a stage
that failed without a failed test to show for it (lint, docs, a build error, a crash) counts as
one failure, so that line alone tells whether the run was good.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("lint", "docs", "asan", "tsan", "mpi", "mpich", "cpp")
#: What CI runs: the plain C++ build of the unit tests ("cpp") runs the very tests that "asan"
#: runs with the sanitizers' checks added, so it is left out unless named.
DEFAULT_STAGES = ("lint", "docs", "asan", "tsan", "mpi", "mpich")
#: The API reference's build: -E reads every page each time (Sphinx warns only about the pages
#: it reads, so an incremental build could pass over a warning), -W fails on any warning.
DOCS_BUILD = ("-m", "sphinx", "-E", "-W", "--keep-going", "-b", "html", "docs/api", "build/docs")
# Per sanitized stage: its -fsanitize= list, the runtime options that make every report fatal
# (non-zero exit: the ctest case fails), and the unit tests it builds and runs (None: all).
SANITIZERS = {
    "asan": (
        "address,undefined",
        {
            "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=1:strict_string_checks=1",
            "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
        },
        None,
    ),
    "tsan": (
        "thread",
        {"TSAN_OPTIONS": "halt_on_error=1:second_deadlock_stack=1"},
        (
            "test_arena",
            "test_barrier",
            "test_heap",
            "test_protocol",
            "test_reduction",
            "test_vexchange",
        ),
    ),
}
# Sanitized builds at -O1, as AddressSanitizer's and ThreadSanitizer's documentation advise:
# about half the build time of -O3, the reports the same.
SANITIZED_BUILD = ("-DCMAKE_BUILD_TYPE=Debug", "-DCMAKE_CXX_FLAGS_DEBUG=-O1")
SUMMARY_RE = re.compile(r"^\s*(\d+) passed, (\d+) failed, (\d+) skipped\s*$")
CTEST_SUMMARY_RE = re.compile(r"(\d+)% tests passed, (\d+) tests? failed out of (\d+)")


@dataclass
class StageResult:
    name: str
    status: str = "passed"  # passed, failed, skipped
    seconds: float = 0.0
    note: str = ""
    counts: dict[str, int] = field(default_factory=lambda: {"passed": 0, "failed": 0, "skipped": 0})


def banner(text: str) -> None:
    print(f"\n===== {text}", flush=True)


def compiler_cache() -> dict[str, str]:
    """The environment that sends the stages' C++ builds through ccache where it is installed
    (the README's test command installs it): the sanitized unit-test builds and the MPICH
    stage's wheel build come back from the cache when their sources did not change since an
    earlier run on this machine, in any clone (paths taken relative to the clone's root)."""
    if shutil.which("ccache") is None:
        return {}
    return {
        "CMAKE_CXX_COMPILER_LAUNCHER": "ccache",
        "CMAKE_C_COMPILER_LAUNCHER": "ccache",
        "CCACHE_BASEDIR": str(ROOT),
        "CCACHE_NOHASHDIR": "true",
    }


def run(cmd: list[str], **kwargs) -> int:
    """Runs `cmd` from the repository root with output passed through; returns its status."""
    print("$ " + " ".join(str(c) for c in cmd), flush=True)
    try:
        return subprocess.run(cmd, cwd=kwargs.pop("cwd", ROOT), **kwargs).returncode
    except FileNotFoundError as exc:
        print(f"ci.py: {exc}", flush=True)
        return 127


def stage_lint(result: StageResult, _args: argparse.Namespace) -> None:
    if not (ROOT / ".pre-commit-config.yaml").exists():
        result.status, result.note = "skipped", "no .pre-commit-config.yaml"
        print("lint: no .pre-commit-config.yaml in the repository, nothing to run", flush=True)
        return
    exe = shutil.which("pre-commit")
    cmd = [exe] if exe else [sys.executable, "-m", "pre_commit"]
    if run([*cmd, "run", "--all-files", "--show-diff-on-failure"]) != 0:
        result.status, result.note = "failed", "pre-commit reported problems"


def stage_docs(result: StageResult, _args: argparse.Namespace) -> None:
    missing = [m for m in ("sphinx", "numpydoc") if importlib.util.find_spec(m) is None]
    if missing:
        result.status = "failed"
        result.note = f"{', '.join(missing)} not installed (pip install '.[docs]')"
        print(f"docs: {result.note}", flush=True)
        return
    if run([sys.executable, *DOCS_BUILD]) != 0:
        result.status, result.note = "failed", "Sphinx reported warnings or errors"


def pybind11_cmake_dir() -> str | None:
    """pybind11's CMake package directory, for the top-level CMakeLists.txt's find_package."""
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pybind11", "--cmakedir"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None


def ctest_counts(junit: Path, log: str) -> dict[str, int] | None:
    """Test counts from ctest's JUnit file, else from its "N% tests passed" line."""
    if junit.exists():
        try:
            cases = list(ET.parse(junit).getroot().iter("testcase"))
        except ET.ParseError:
            cases = []
        if cases:
            counts = {"passed": 0, "failed": 0, "skipped": 0}
            for case in cases:
                status = case.get("status", "run")
                if case.find("failure") is not None or case.find("error") is not None:
                    counts["failed"] += 1
                elif case.find("skipped") is not None or status in ("disabled", "notrun"):
                    counts["skipped"] += 1
                else:
                    counts["passed"] += 1
            return counts
    match = CTEST_SUMMARY_RE.search(log)
    if match:
        failed, total = int(match.group(2)), int(match.group(3))
        return {"passed": total - failed, "failed": failed, "skipped": 0}
    return None


def tee(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Runs `cmd`, echoing its output as it comes; returns its status and the whole output."""
    print("$ " + " ".join(str(c) for c in cmd), flush=True)
    try:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
        )
    except FileNotFoundError as exc:
        print(f"ci.py: {exc}", flush=True)
        return 127, ""
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        lines.append(line)
    return proc.wait(), "".join(lines)


def stage_cpp(result: StageResult, args: argparse.Namespace) -> None:
    build_and_run_unit_tests(result, args, (ROOT / args.build_dir).resolve())


def stage_sanitized(result: StageResult, args: argparse.Namespace) -> None:
    flags, runtime, tests = SANITIZERS[result.name]
    build = (ROOT / "build" / f"cpp-{result.name}").resolve()
    options = (f"-DZCOLL_SANITIZE={flags}", *SANITIZED_BUILD)
    build_and_run_unit_tests(result, args, build, options, runtime, tests)


def build_and_run_unit_tests(
    result: StageResult,
    args: argparse.Namespace,
    build: Path,
    cmake_options: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    tests: tuple[str, ...] | None = None,
) -> None:
    """Configures `build`, builds the C++ unit tests (those named in `tests`, else all) and runs
    them under ctest (with `env` added to the environment); `result` gets ctest's counts."""
    configure = [
        "cmake",
        "-S",
        str(ROOT),
        "-B",
        str(build),
        "-DZCOLL_BUILD_TESTS=ON",
        "-DCMAKE_BUILD_TYPE=Release",
        f"-DPython_EXECUTABLE={sys.executable}",
        *cmake_options,
    ]
    pybind11_dir = pybind11_cmake_dir()
    if pybind11_dir:
        configure.append(f"-Dpybind11_DIR={pybind11_dir}")
    cache = {**os.environ, **compiler_cache()}  # ccache reads its settings at each compile
    if run(configure, env=cache) != 0:
        result.status = "failed"
        result.note = "CMake configure failed (doctest missing? apt-get install doctest-dev)"
        return
    build_cmd = ["cmake", "--build", str(build), "--target", *(tests or ["zcoll_cpp_tests"])]
    if run([*build_cmd, "--parallel", str(args.jobs)], env=cache) != 0:
        result.status, result.note = "failed", "build failed"
        return
    junit = build / "ctest-junit.xml"
    junit.unlink(missing_ok=True)
    code, log = tee(
        [
            "ctest",
            "--test-dir",
            str(build),
            "--output-on-failure",
            "--parallel",
            str(args.jobs),
            "--output-junit",
            str(junit),
            *(["-R", f"^({'|'.join(tests)})/"] if tests else []),
        ],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )
    counts = ctest_counts(junit, log)
    if counts is not None:
        result.counts = counts
    if code != 0 or counts is None or counts["failed"] or not counts["passed"]:
        result.status = "failed"
        result.note = f"ctest exit {code}" + ("" if counts else ", no test counts found")


def stage_mpi(result: StageResult, args: argparse.Namespace) -> None:
    run_mpi_and_count(result, [sys.executable, str(ROOT / "tests" / "run_mpi.py"), *args.mpi_args])


def run_mpi_and_count(
    result: StageResult, cmd: list[str], env: dict[str, str] | None = None
) -> None:
    """Runs a tests/run_mpi.py command; adds its closing counts to `result`, which fails when
    the command did or printed no counts."""
    code, log = tee(cmd, cwd=ROOT, env=env)
    for line in reversed(log.splitlines()):
        match = SUMMARY_RE.match(line)
        if match:
            for key, value in zip(("passed", "failed", "skipped"), match.groups()):
                result.counts[key] += int(value)
            break
    else:
        result.note = "no summary line from run_mpi.py"
    if code != 0 or result.note:
        result.status = "failed"
        result.note = result.note or f"run_mpi.py exit {code}"


#: The MPICH stage: a user's install on MPICH (and so on Intel MPI, Cray MPICH, MVAPICH, which
#: share its ABI) beside the system's default Open MPI -- mpi4py built from source against it
#: in a venv of its own, zcoll installed from the checkout there (its build asks that mpi4py
#: which MPI to use) -- then the collectives on WORLD and derived communicators, one run on
#: virtual nodes and the FFT and heat examples, under mpiexec.mpich.
MPICH_VENV = ROOT / "build" / "mpich-venv"
MPICH_MODULES = (
    "test_collectives.py",
    "test_reductions.py",
    "test_vcoll.py",
    "fft/test_fft.py",
    "fft/test_mpi_runs.py",
    "test_examples.py",
    "test_mpi_library.py",
)
MPICH_NODE_MODULES = ("test_collectives.py", "test_reductions.py", "test_internode.py")
# What the MPI library cannot change: the block orders other than "auto" only reorder a node's
# own copies (the engine, no MPI call), which the Open MPI stage checks at every P; and one
# rank's calls, which make no MPI call but the communicator's, the same at P = 2 (its WORLD,
# dup, reversed split and SELF), so the modules run at P = 2 only.
MPICH_SELECTION = ("-k", "not row and not column and not hilbert and not morton")
# At P = 3, where MPICH's waits spin without yielding (an oversubscribed job's MPI call takes a
# scheduler slice: these modules took 295 s at P = 3 against 15 s at P = 2), only what depends
# on MPICH there: its neighbourhood calls on odd topologies (vcoll_reference.py probes where
# they deviate from the standard) and the library check. Odd P itself runs under Open MPI.
MPICH_ODD_SELECTION = ("test_vcoll.py", "test_mpi_library.py")
MPICH_PACKAGES = ("numpy", "pytest", "scipy", "pyfftw", "platformdirs")
MPICH_BUILD_PACKAGES = ("scikit-build-core>=0.11.1", "pybind11>=2.12")


MPICH_PYTHON = MPICH_VENV / "bin" / "python"
#: Where the MPICH install started beside the mpi stage writes its output.
MPICH_INSTALL_LOG = ROOT / "build" / "mpich-install.log"


def mpich_installed() -> bool:
    return bool(shutil.which("mpicc.mpich") and shutil.which("mpiexec.mpich"))


def mpich_env() -> dict[str, str]:
    env = {
        **os.environ,
        **compiler_cache(),
        "MPICC": "mpicc.mpich",
        "ZCOLL_MPIEXEC": "mpiexec.mpich",
    }
    env.pop("PYTHONPATH", None)
    return env


def mpich_install_steps() -> list[list[str]]:
    pip = [str(MPICH_PYTHON), "-m", "pip", "install", "-q"]
    return [
        [sys.executable, "-m", "venv", "--clear", str(MPICH_VENV)],
        [*pip, "--no-binary=mpi4py", "mpi4py", *MPICH_PACKAGES, *MPICH_BUILD_PACKAGES],
        # Not MPICC: the build is to find mpi4py's MPI by itself. Its build tools are the venv's
        # (not a temporary build environment), so that ccache sees the same paths every run.
        ["env", "-u", "MPICC", *pip, "--no-build-isolation", str(ROOT), "-Cbuild-dir=build/mpich"],
    ]


def start_mpich_install() -> subprocess.Popen | None:
    """Starts the MPICH stage's install (mpich_install_steps, one after the other) in the
    background, its output to MPICH_INSTALL_LOG; None where MPICH is not installed. The mpi
    stage begins with its one-rank run, a single process on a 2-core machine, and its other
    runs' ranks wait often: a build on one job at the lowest priority beside them (mpi4py's is
    one compile; zcoll's is held to one job) costs that stage little and saves the MPICH stage
    its build, about 4 minutes on a machine whose caches are cold."""
    if not mpich_installed():
        return None
    script = " && ".join(
        f"echo {shlex.quote('$ ' + shlex.join(step))} && {shlex.join(step)}"
        for step in mpich_install_steps()
    )
    MPICH_INSTALL_LOG.parent.mkdir(parents=True, exist_ok=True)
    env = {**mpich_env(), "CMAKE_BUILD_PARALLEL_LEVEL": "1"}
    print(f"$ (in the background, output to {MPICH_INSTALL_LOG}) MPICH stage's install", flush=True)
    # At the lowest priority: it takes the cores the tests leave idle, and never slows a test.
    with MPICH_INSTALL_LOG.open("w") as log:  # the child keeps its own descriptor
        return subprocess.Popen(
            ["nice", "-n", "19", "bash", "-c", script], cwd=ROOT, env=env, stdout=log, stderr=log
        )


def install_for_mpich(result: StageResult, args: argparse.Namespace) -> bool:
    """The MPICH venv's install: waits for the one started beside the mpi stage (and prints its
    output), else runs its steps now. False, with `result` failed, if a step failed."""
    started = getattr(args, "mpich_install", None)
    if started is not None:
        code = started.wait()
        print(MPICH_INSTALL_LOG.read_text(errors="replace"), end="", flush=True)
        if code != 0:
            result.status, result.note = "failed", f"install failed (exit {code})"
        return code == 0
    for step in mpich_install_steps():
        if run(step, env=mpich_env()) != 0:
            result.status, result.note = "failed", f"install step failed: {' '.join(step[:4])}"
            return False
    return True


def stage_mpich(result: StageResult, args: argparse.Namespace) -> None:
    if not mpich_installed():
        result.status, result.note = "failed", "no mpicc.mpich (apt-get install mpich libmpich-dev)"
        return
    python = MPICH_PYTHON
    env = mpich_env()
    if not install_for_mpich(result, args):
        return
    check = (
        "import zcoll; s = zcoll.settings(); assert s.mpi_libraries_match, s; print(s.mpi_library)"
    )
    if run([str(python), "-W", "error", "-c", check], env=env) != 0:
        result.status, result.note = "failed", "zcoll is not built against mpi4py's MPICH"
        return
    run_mpi = [str(python), str(ROOT / "tests" / "run_mpi.py"), "--no-virtual-nodes"]
    tests = [str(ROOT / "tests" / m) for m in MPICH_MODULES]
    run_mpi_and_count(result, [*run_mpi, "-n", "2", "--", *tests, *MPICH_SELECTION], env)
    odd = [str(ROOT / "tests" / m) for m in MPICH_ODD_SELECTION]
    run_mpi_and_count(
        result, [*run_mpi, "-n", "3", "--", *odd, "-k", "neighbor or mpi_library"], env
    )
    # Two virtual nodes of one rank: every message between them goes by MPI (the C++ sender).
    # Not more ranks: MPICH's waits spin without yielding, which makes each MPI call of an
    # oversubscribed job take a scheduler slice (P = 3: ms per call, 7x Open MPI's time).
    node_tests = [str(ROOT / "tests" / m) for m in MPICH_NODE_MODULES]
    nodes = {**env, "ZCOLL_VIRTUAL_NODE_SIZE": "1"}
    run_mpi_and_count(result, [*run_mpi, "-n", "2", "--", *node_tests, *MPICH_SELECTION], nodes)
    examples = (
        ["examples/fft3d.py", "--n", "24", "--repeat", "2"],
        ["examples/heat.py", "--steps", "20"],
    )
    for ranks in (1, 2):  # P = 3: MPICH's spinning waits; odd P runs under Open MPI
        for example in examples:
            job = ["timeout", "300", "mpiexec.mpich", "-n", str(ranks), str(python), *example]
            if run(job, env=env) != 0:  # bounded like run_mpi.py's runs
                result.status, result.note = "failed", f"{example[0]} failed at P = {ranks}"
                result.counts["failed"] += 1
            else:
                result.counts["passed"] += 1


RUNNERS = {
    "lint": stage_lint,
    "docs": stage_docs,
    "cpp": stage_cpp,
    "asan": stage_sanitized,
    "tsan": stage_sanitized,
    "mpi": stage_mpi,
    "mpich": stage_mpich,
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    ours, extra = argv, []
    if "--" in argv:
        cut = argv.index("--")
        ours, extra = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Arguments after -- are passed to tests/run_mpi.py.",
    )
    parser.add_argument(
        "--stages",
        default=",".join(DEFAULT_STAGES),
        help=f"comma-separated stages to run, in this order: {','.join(STAGES)} "
        f"(default: {','.join(DEFAULT_STAGES)})",
    )
    parser.add_argument("--no-lint", action="store_true", help="skip the lint stage")
    parser.add_argument(
        "--build-dir",
        default="build/cpp-tests",
        help="C++ test build directory (default: %(default)s)",
    )
    parser.add_argument("--jobs", type=int, default=2, help="build and ctest jobs (default: 2)")
    args = parser.parse_args(ours)
    wanted = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in STAGES]
    if unknown or not wanted:
        parser.error(f"unknown stage(s) {', '.join(unknown) or '(none given)'}; pick from {STAGES}")
    args.selected = [s for s in STAGES if s in wanted]
    args.mpi_args = extra
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    results = []
    for name in args.selected:
        result = StageResult(name)
        banner(f"stage {name}")
        t0 = time.monotonic()
        if name == "mpi" and "mpich" in args.selected:
            args.mpich_install = start_mpich_install()
        if name == "lint" and args.no_lint:
            result.status, result.note = "skipped", "--no-lint"
            print("lint: skipped (--no-lint)", flush=True)
        else:
            try:
                RUNNERS[name](result, args)
            except Exception as exc:  # a driver bug must not hide the other stages
                result.status, result.note = "failed", f"{type(exc).__name__}: {exc}"
        result.seconds = time.monotonic() - t0
        c = result.counts
        print(
            f"===== stage {name}: {result.status} in {result.seconds:.1f} s"
            + (f" ({result.note})" if result.note else "")
            + f"; {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped",
            flush=True,
        )
        results.append(result)

    banner("summary")
    totals = {"passed": 0, "failed": 0, "skipped": 0}
    for r in results:
        c = r.counts
        print(
            f"{r.name:5} {r.status:8} {r.seconds:8.1f} s  "
            f"{c['passed']:5} passed {c['failed']:4} failed {c['skipped']:4} skipped"
            + (f"  {r.note}" if r.note else "")
        )
        for k in totals:
            totals[k] += c[k]
        if r.status == "failed" and not c["failed"]:
            totals["failed"] += 1  # a failed stage always shows in the closing line
    failed = any(r.status == "failed" for r in results)
    print(f"total {sum(r.seconds for r in results):.1f} s; {'FAILED' if failed else 'OK'}")
    print(f"{totals['passed']} passed, {totals['failed']} failed, {totals['skipped']} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
