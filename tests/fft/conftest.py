"""Fixtures of zcoll.fft's tests."""

from __future__ import annotations

import pytest

#: Test modules whose sweeps check zcoll's own transposes from a plan's first call
#: (ZCOLL_COLD_RUNS=0). The others keep the rule, under which a plan's first calls run their
#: transposes through MPI: the parity with mpi4py-fft, the set-up tests, the runs through MPI,
#: the cold calls' own tests.
ZCOLL_TRANSPOSES_FIRST = {"test_fft", "test_mpifft", "test_darray"}


@pytest.fixture(autouse=True)
def _zcoll_transposes_first(request, monkeypatch):
    if request.module.__name__.rpartition(".")[2] in ZCOLL_TRANSPOSES_FIRST:
        monkeypatch.setenv("ZCOLL_COLD_RUNS", "0")


@pytest.fixture
def plans():
    """make(comm, shape, ...) builds a zcoll.fft.PFFT; every plan built is destroyed after the
    test."""
    from zcoll.fft import PFFT

    made = []

    def make(*args, **kwargs):
        plan = PFFT(*args, **kwargs)
        made.append(plan)
        return plan

    yield make
    for plan in reversed(made):
        plan.destroy()
