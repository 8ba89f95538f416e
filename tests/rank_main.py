"""Entry point of one rank of an mpiexec'd test run (used by run_mpi.py).

Rank 0 prints pytest's normal output; the other ranks write theirs to rank<r>.log. Every rank
writes JUnit XML to rank<r>.xml in $ZCOLL_TEST_RESULTS.
"""

import os
import sys
from pathlib import Path

import pytest
from mpi4py import MPI

rank = MPI.COMM_WORLD.rank
out = Path(os.environ.get("ZCOLL_TEST_RESULTS", "."))
# A tuning table in the user's cache directory must not steer the tests' "auto" choices: the
# default table is looked for in an empty cache directory (the tuning tests name their own).
os.environ["XDG_CACHE_HOME"] = str(out / "cache")
os.environ.pop("ZCOLL_TUNING_FILE", None)
if rank != 0:
    log = open(out / f"rank{rank}.log", "w")  # noqa: SIM115 - lives as long as the process
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
extra = sys.argv[1:]
# Test files or directories named on the command line replace the default (the whole suite).
names_paths = any(Path(a.split("::")[0]).exists() for a in extra if not a.startswith("-"))
tests = [] if names_paths else [str(Path(__file__).resolve().parent)]
args = [
    *tests,
    "-p",
    "no:cacheprovider",
    "-q",
    "--color=no",
    f"--junitxml={out / f'rank{rank}.xml'}",
]
code = pytest.main(args + extra)
sys.stdout.flush()
# A rank whose tests failed must not make mpiexec abort the others mid-test: exit together.
codes = MPI.COMM_WORLD.allgather(int(code))
sys.exit(max(codes))
