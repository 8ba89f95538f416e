"""A PFFT's first calls on a new grid: its arrays made with no communication, its transposes
through MPI (zcoll.fft._mpi_runs.ColdCalls) for the rule's count of calls, then zcoll's plans.
Every result is numpy.fft's transform of the global array; what was made is read from the plan
and from zcoll's registry of contexts."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import zcoll
from helpers import all_ranks_agree
from helpers.fft import global_array, rel_err
from helpers.pencil import outcome
from zcoll import _context, _core
from zcoll.fft import PFFT
from zcoll.fft import pencil as pencil_module

# (global shape, dtype, grid): a slab, pencils, a real-to-complex 4-D plan, a 2-D plan
PLANS = [
    ((9, 10, 11), np.complex128, (-1,)),
    ((9, 10, 11), np.complex128, None),
    ((8, 9, 6, 5), np.float32, None),
    ((10, 12), np.complex64, None),
]
TOLERANCE = {np.float32: 2e-5, np.complex64: 2e-5, np.complex128: 1e-12}


def moving(plan: PFFT) -> list:
    """The plan's stages whose transpose crosses ranks."""
    return [s for s in plan._stages if s.moves]


def spectrum(g: np.ndarray) -> np.ndarray:
    """numpy.fft's forward transform of the global array, normalised as PFFT's forward."""
    f = np.fft.rfftn(g) if g.dtype.kind == "f" else np.fft.fftn(g)
    return f / g.size


def state(plan: PFFT) -> tuple[bool, bool]:
    """(no transpose's communicator has a context, no transpose has its plans)."""
    stages = moving(plan)
    return (
        not any(_context.has_context(s.transfer.comm) for s in stages),
        all(s.plans is None for s in stages),
    )


def run_and_check(plan: PFFT, g: np.ndarray, k: int) -> list[str]:
    """Call k (from 0): forward of the rank's part of `g` scaled by k + 1 on even calls,
    backward of the spectrum on odd ones, each against numpy.fft."""
    bad = []
    tol = TOLERANCE[g.dtype.type]
    scale = k + 1
    if k % 2 == 0:
        got = plan.forward(g[plan.local_slice(False)] * scale)
        want = spectrum(g)[plan.local_slice(True)] * scale
    else:
        got = plan.backward(spectrum(g)[plan.local_slice(True)] * scale)
        want = g[plan.local_slice(False)] * scale
    if (e := rel_err(got, want)) > tol:
        bad.append(f"call {k}: error {e:.3g}")
    return bad


@pytest.mark.parametrize("case", range(len(PLANS)))
def test_cold_calls_then_zcoll_transposes(world, monkeypatch, case):
    """ZCOLL_COLD_RUNS=3: calls 0-2 make no context and no plan, call 3 makes both; every
    call gives numpy.fft's result."""
    monkeypatch.setenv("ZCOLL_COLD_RUNS", "3")
    zcoll.barrier(world)  # a node pool, from which the grid's arrays come
    shape, dtype, grid = PLANS[case]
    g = global_array(shape, dtype, seed=30 + case)
    plan = PFFT(world, shape, dtype=dtype, grid=grid, backend="numpy")
    crosses = bool(moving(plan))
    bad = []
    if crosses and _context.has_context(plan.subcomm.comm or world):
        bad.append("construction made the grid's context")
    if crosses and not all(
        zcoll.is_shared(x) for x in (plan.forward.input_array, plan.forward.output_array)
    ):
        bad.append("the plan's arrays are not in the pool's arena")  # fmt: skip
    for k in range(6):
        bad += run_and_check(plan, g, k)
        no_context, no_plans = state(plan)
        if crosses and k < 3 and not (no_context and no_plans):
            bad.append(f"call {k} made a context or plans")
        if crosses and k >= 3 and (no_context or no_plans):
            bad.append(f"call {k}: no context or plans after the cold calls")
    plan.destroy()
    all_ranks_agree(world, not bad, f"{shape} {np.dtype(dtype)} {grid}: {bad}")


def test_the_rule_counts_the_calls(world):
    """Under the rule a slab plan's calls go through MPI as many times as
    _core.cold_plan_runs gives for its one transpose of the whole array (bytes per rank),
    then through zcoll's plans."""
    if world.size == 1:
        pytest.skip("one rank: no transpose")
    zcoll.barrier(world)
    shape = (8, 9, 7)
    limit = _core.cold_plan_runs([int(np.prod(shape)) * 16 // world.size])
    g = global_array(shape, np.complex128, seed=41)
    plan = PFFT(world, shape, dtype=np.complex128, grid=(-1,), backend="numpy")
    ok = 2 <= limit < 100  # a small plan: a few calls before the set-up pays
    bad = []
    for k in range(limit + 2):
        bad += run_and_check(plan, g, k)
        ok &= state(plan) == ((True, True) if k < limit else (False, False))
    plan.destroy()
    all_ranks_agree(world, ok and not bad, f"{limit} cold calls: {bad}")


def test_every_rank_of_a_pencil_grid_ends_the_cold_calls_together(world):
    """Under the rule, on a pencil grid whose rows hold different extents of an odd shape
    (3/2 points: the ranks' shares differ), every rank counts the same calls, so all make the
    contexts at the same call (a rank that counted from its own share would make them while
    its peers still run through MPI: a hang); every result is numpy.fft's."""
    zcoll.barrier(world)
    shape = (max(5, world.size), 5, 9)
    g = global_array(shape, np.complex128, seed=47)
    plan = PFFT(world, shape, dtype=np.complex128, backend="numpy")
    limit = plan._cold.limit if plan._cold is not None else 0
    limits = world.allgather(limit)
    bad = [] if len(set(limits)) == 1 else [f"the ranks count {limits}"]
    for k in range(limit + 2 if not bad else 0):  # (counts that differ would hang)
        bad += run_and_check(plan, g, k)
    ok = not moving(plan) or state(plan) == (False, False)
    plan.destroy()
    all_ranks_agree(world, ok and not bad, f"{bad}")


def test_an_error_on_one_rank_while_cold(world, monkeypatch):
    """A bad input array on rank 0 only: every rank raises its ValueError (naming rank 0),
    nothing is made, and the next call is right."""
    if world.size == 1:
        pytest.skip("needs a peer")
    monkeypatch.setenv("ZCOLL_COLD_RUNS", "10")
    shape = (9, 8, 6)
    g = global_array(shape, np.complex128, seed=42)
    plan = PFFT(world, shape, dtype=np.complex128, backend="numpy")
    good = g[plan.local_slice(False)]
    mine = np.zeros((1, 2)) if world.rank == 0 else good
    kind, result = outcome(lambda: plan.forward(mine))
    ok = kind == "ValueError" and "[rank 0]" in str(result) and "input_array" in str(result)
    ok &= state(plan) == (True, True)
    bad = run_and_check(plan, g, 0)
    plan.destroy()
    all_ranks_agree(world, ok and not bad, f"{kind}: {result}; {bad}")


def test_fused_components_end_the_cold_calls(world, monkeypatch):
    """A field with leading component axes moved fused needs zcoll's transposes: its call ends
    the cold calls on every rank, and every component is numpy.fft's."""
    monkeypatch.setenv("ZCOLL_COLD_RUNS", "10")
    shape = (8, 6, 5)
    g = np.stack([global_array(shape, np.complex128, seed=43 + i) for i in range(3)])
    plan = PFFT(world, shape, dtype=np.complex128, backend="numpy", components="fused")
    before = pencil_module.made["plans"]
    u = np.ascontiguousarray(g[(slice(None), *plan.local_slice(False))])
    got = plan.forward(u)
    want = np.stack([spectrum(c)[plan.local_slice(True)] for c in g])
    ok = rel_err(got, want) < 1e-12
    if moving(plan):
        ok &= pencil_module.made["plans"] > before and state(plan) == (False, False)
    plan.destroy()
    all_ranks_agree(world, ok, "fused components while cold")


def test_arrays_other_contexts_cannot_share_stay_with_mpi(world, monkeypatch):
    """Arrays made from one node pool, and the transposes' contexts made in full later
    (ZCOLL_NODE_POOLS=0 by then: a pool of their own, which does not share them): past the
    rule's count the calls stay with MPI, and every result is still numpy.fft's."""
    if world.size == 1:
        pytest.skip("one rank: no transpose")
    monkeypatch.setenv("ZCOLL_COLD_RUNS", "1")
    zcoll.barrier(world)
    comm = world.Dup()  # without a context: the plan makes its arrays alone
    shape = (8, 7, 6)
    g = global_array(shape, np.complex128, seed=44)
    plan = PFFT(comm, shape, dtype=np.complex128, backend="numpy")
    ok = zcoll.is_shared(plan.forward.input_array) and not _context.has_context(comm)
    monkeypatch.setenv("ZCOLL_NODE_POOLS", "0")
    bad = []
    for k in range(4):
        bad += run_and_check(plan, g, k)
    ok &= all(s.plans is None for s in moving(plan)) and plan._cold is not None
    plan.destroy()
    comm.Free()
    all_ranks_agree(world, ok and not bad, f"plans made on unshared arrays, or {bad}")


def test_a_plan_on_a_grid_with_contexts_makes_none(world, monkeypatch):
    """A small plan on a Subcomm whose communicators already have contexts: its arrays come
    from the grid context's pool arena (no barrier), and past the cold calls
    (ZCOLL_COLD_RUNS=1) its plans are made on those contexts, no new one."""
    if world.size == 1:
        pytest.skip("one rank: no transpose")
    from zcoll.fft.pencil import Subcomm

    monkeypatch.setenv("ZCOLL_COLD_RUNS", "1")
    sub = Subcomm(world, [0, 1, 1])
    shape = (max(8, world.size + 2), max(6, world.size), 4)  # the slab fits every P
    g = global_array(shape, np.complex128, seed=45)
    first = PFFT(sub, shape, dtype=np.complex128, backend="numpy")
    comms = [sub.comm] + [s.transfer.comm for s in moving(first)]
    contexts = {id(c): _context.context(c) for c in comms}
    second = PFFT(sub, shape, dtype=np.complex128, backend="numpy")
    ok = zcoll.is_shared(second.forward.input_array)
    bad = run_and_check(second, g, 0)
    ok &= state(second) == (False, True)  # the contexts were there; the first call planned none
    bad += run_and_check(second, g, 1)
    ok &= state(second)[1] is False
    ok &= all(_context.context(s.transfer.comm) is contexts[id(s.transfer.comm)]
              for s in moving(second))  # fmt: skip
    first.destroy()
    second.destroy()
    sub.destroy()
    all_ranks_agree(world, ok and not bad, f"{bad}")


def test_one_rank_never_communicates(monkeypatch):
    """On one rank there is no transpose to run through MPI or to plan."""
    monkeypatch.setenv("ZCOLL_COLD_RUNS", "0")
    shape = (6, 5, 4)
    g = global_array(shape, np.complex128, seed=46)
    plan = PFFT(MPI.COMM_SELF, shape, dtype=np.complex128, backend="numpy")
    ok = plan._cold is None and not moving(plan)
    bad = run_and_check(plan, g, 0) + run_and_check(plan, g, 1)
    plan.destroy()
    assert ok and not bad, bad
