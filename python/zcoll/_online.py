"""HINT's online selection of the block order (section V-C): ``ZCOLL_TUNING=online``.

For calls no tuning-table rule covers, the first calls of each block size try every order (and
the eager path where the call fits it) and keep the fastest, agreed on by every rank.
"""

from __future__ import annotations

import math
import time
from typing import final

import numpy as np
from mpi4py import MPI

from . import _core
from ._registry import AUTO, COLLECTIVES, EAGER, ORDERS

__all__ = ["OnlineTuner"]


@final  # so that `type(state) is not _Trial` narrows a state to int
class _Trial:
    """Timings of the candidates for one (collective, block size): RUNS calls each, in turn."""

    RUNS = 3

    def __init__(self, candidates: list[int]) -> None:
        self.candidates = candidates
        self.best = [math.inf] * len(candidates)
        self.calls = 0

    def next_code(self) -> int:
        return self.candidates[self.calls // self.RUNS]

    def record(self, seconds: float) -> bool:
        """Record the last call's time; whether every candidate has had its runs."""
        i = self.calls // self.RUNS
        self.best[i] = min(self.best[i], seconds)
        self.calls += 1
        return self.calls == self.RUNS * len(self.candidates)


class OnlineTuner:
    """HINT's online order selection for one context's ``order="auto"`` calls.

    For each (collective, block size) that no table rule covers, the first calls cycle through
    the orders (and the eager path when the call fits it), ``_Trial.RUNS`` calls each, timing
    each call; then one non-blocking allreduce (MAX over the ranks of each candidate's best
    time, all ranks reaching it at the same call) picks the winner, kept for later calls. The
    ranks make the same calls in the same order (collectives), so they step in lockstep; a call
    that raises records nothing, on every rank. Every candidate gives the same result.
    """

    MAX_SIZES = 256  # block sizes tracked; later new sizes keep the built-in choice

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        # collective -> bytes received per call -> the trial, or the order code chosen
        self.states: dict[str, dict[int, _Trial | int]] = {op: {} for op in COLLECTIVES}

    def engine(self, opname: str):
        """The context's entry point for `opname` with online selection in front of it."""
        run = getattr(self.ctx.core, opname)
        # On the per-call path: names bound here, one dict per collective keyed by an int.
        states, auto, ndarray = self.states[opname], _core.AUTO_ORDER, np.ndarray

        def tuned(sendbuf, recvbuf, code: int, copy: int) -> None:
            if code != auto or not isinstance(recvbuf, ndarray):
                return run(sendbuf, recvbuf, code, copy)
            received = recvbuf.nbytes
            state = states.get(received)
            if state is None:
                state = self._start(opname, received)
            if type(state) is not _Trial:
                return run(sendbuf, recvbuf, state, copy)
            start = time.perf_counter()
            run(sendbuf, recvbuf, state.next_code(), copy)
            if state.record(time.perf_counter() - start):
                states[received] = self._decide(state)
            return None

        return tuned

    def _start(self, opname: str, received: int) -> _Trial | int:
        core = self.ctx.core
        block = received // self.ctx.size
        _, from_rule = core.auto_order(opname, block, received)
        tracked = sum(map(len, self.states.values()))
        if from_rule or block == 0 or core.size < 2 or tracked >= self.MAX_SIZES:
            state: _Trial | int = _core.AUTO_ORDER
        else:
            candidates = list(range(len(ORDERS)))
            if received <= core.eager_bytes:
                candidates.append(_core.EAGER_ORDER)
            state = _Trial(candidates)
        self.states[opname][received] = state
        return state

    def _decide(self, trial: _Trial) -> int:
        mine = np.array(trial.best)
        worst = np.empty_like(mine)
        request = self.ctx.tuning_comm().Iallreduce(mine, worst, op=MPI.MAX)
        self.ctx.transport.wait([request], "zcoll online tuning (agreeing on the fastest order)")
        return trial.candidates[int(np.argmin(worst))]

    def choice(self, opname: str, block_bytes: int) -> str | None:
        """The order chosen for blocks of `block_bytes` ("eager", an order, "auto" where the
        table or the built-in rule decides), or None while still trying."""
        state = self.states[opname].get(block_bytes * self.ctx.size)
        if type(state) is not int:
            return None
        if state == _core.AUTO_ORDER:
            return AUTO
        return EAGER if state == _core.EAGER_ORDER else ORDERS[state]
