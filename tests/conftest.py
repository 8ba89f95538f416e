"""Shared fixtures for zcoll's tests; the suite runs both alone and under mpiexec.

Every rank runs every test in the same order, so a test is collective: anything it skips, it
skips on every rank. Assertions about collective results go through
`helpers.all_ranks_agree`, so that a wrong result on one rank fails the test on every rank and
the ranks stay in step. Helpers that tests import live in the package `helpers`.

A watchdog (faulthandler) dumps every thread's stack and exits if one test takes longer than
ZCOLL_TEST_WATCHDOG seconds (default 300): one stuck rank cannot stall CI, and mpiexec then
tears the job down.
"""

from __future__ import annotations

import faulthandler
import os
import sys

import pytest
from mpi4py import MPI

import zcoll
from helpers import COMM_KINDS

WATCHDOG_SECONDS = float(os.environ.get("ZCOLL_TEST_WATCHDOG", "300"))


# Fail fast in tests: a missing peer is reported after 20 s rather than the default 60 s.
zcoll.set_timeout(float(os.environ.get("ZCOLL_TEST_TIMEOUT", "20")))


@pytest.fixture(autouse=True)
def watchdog():
    faulthandler.dump_traceback_later(WATCHDOG_SECONDS, exit=True, file=sys.stderr)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="session")
def world() -> MPI.Intracomm:
    return MPI.COMM_WORLD


@pytest.fixture(params=sorted(COMM_KINDS))
def comm(request, world):
    """Each communicator kind zcoll must support; freed after the test where it was created."""
    c = COMM_KINDS[request.param](world)
    yield c
    if c not in (MPI.COMM_WORLD, MPI.COMM_SELF):
        c.Free()
