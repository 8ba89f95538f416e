"""Fixtures of zcoll.fft's tests."""

from __future__ import annotations

import pytest


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
