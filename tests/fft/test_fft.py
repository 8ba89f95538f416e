"""zcoll.fft: distributed FFTs and redistributions against NumPy on the gathered global array.

Every rank builds the same global array from a seeded generator and takes its own part
(`local_slice(False)`); the reference is `numpy.fft.fftn` / `rfftn` of the whole array (in
double precision), of which each rank compares the part `local_slice(True)` names. Transfers
are compared bit for bit with slices of the global array. Bad input must raise the same
exception on every rank. Every plan a test makes is destroyed when the test ends.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import zcoll
from helpers import all_ranks_agree, private_buffers_by, random_bytes
from helpers.fft import abs_err, block, collapsed, global_array, rel_err, tiles
from zcoll import _context
from zcoll.fft import PFFT, DistArray, Transfer, TransferPlan, newDistArray, transfer, transfer_init

REAL = {np.dtype(np.float32): np.dtype(np.complex64), np.dtype(np.float64): np.dtype(np.complex128)}
FFT_DTYPES = [np.float64, np.complex128, np.float32, np.complex64]
SHAPES = [(8, 8, 8), (9, 10, 13), (16, 12, 7), (7, 5, 3)]
# "1xP": axis 0 whole, axis 1 over all ranks (filled in with the communicator's size).
GRIDS = {"pencil": None, "slab": (-1,), "1xP": "1xP"}


def dname(dtype) -> str:
    return np.dtype(dtype).name


def tolerance(dtype) -> float:
    return 1e-5 if np.dtype(dtype) in (np.float32, np.complex64) else 1e-12


def resolve_grid(grid, comm):
    return (1, comm.size) if grid == "1xP" else grid


def reference(u: np.ndarray, axes, full: bool = False) -> np.ndarray:
    """Unnormalised numpy transform of the global array, in double precision; real input gives
    the half spectrum (rfftn) unless `full` (mpi4py-fft's scipy backend: a complex fftn)."""
    axes = tuple(range(u.ndim)) if axes is None else tuple(axes)
    if u.dtype.kind == "f" and not full:
        return np.fft.rfftn(u.astype(np.float64), axes=axes)
    return np.fft.fftn(u.astype(np.complex128), axes=axes)


def expected_groups(size, shape, axes, grid, collapse=False):
    """mpi4py-fft's groups of axes (one serial transform each, the last group first) and the
    input grid, written out independently of zcoll.fft: one axis per group, and with `collapse`
    every group local on input joins the group transformed first."""
    ndim = len(shape)
    groups = [[a % ndim] for a in (range(ndim) if axes is None else axes)]
    if grid is None:
        dims = [0] * ndim
        dims[groups[-1][-1]] = 1
    else:
        dims = [max(0, int(g)) for g in grid] + [1] * (ndim - len(grid))
    dims = list(MPI.Compute_dims(size, dims))
    if collapse:
        groups = collapsed(groups, dims)
    return groups, dims


def expected_pencils(size, shape, axes, grid, real, collapse=False):
    """(global shape, processes per axis) of every pencil of the plan, input first: mpi4py-fft's
    sequence, written out independently of zcoll.fft."""
    groups, dims = expected_groups(size, shape, axes, grid, collapse)
    shape, aligned = list(shape), groups[-1][-1]
    out = [(tuple(shape), tuple(dims))]
    for i, group in enumerate(reversed(groups)):
        axis = group[-1]
        if i == 0 and real:
            shape[axis] = shape[axis] // 2 + 1
        elif i > 0:
            dims[aligned], dims[axis] = dims[axis], dims[aligned]
            aligned = axis
        out.append((tuple(shape), tuple(dims)))
    return out


def grid_too_large(size, shape, axes, grid, real, collapse=False) -> bool:
    pencils = expected_pencils(size, shape, axes, grid, real, collapse)
    return any(n < p for s, d in pencils for n, p in zip(s, d))


def outcome(fn):
    """("ok", result) or (exception type name, message)."""
    try:
        return "ok", fn()
    except (TypeError, ValueError, ImportError, zcoll.PeerError) as exc:
        return type(exc).__name__, str(exc)


def real_layout(dtype, backend=None) -> bool:
    """A real-to-complex plan: real dtype, and not mpi4py-fft's scipy backend (which has no
    real transform: real input gives a full-length complex spectrum)."""
    return np.dtype(dtype) in REAL and backend != "scipy"


def plan_or_error(make, comm, shape, dtype, *, axes=None, grid=None, **kwargs):
    """The plan, or None where the grid is too large for `shape` on this communicator, in
    which case every rank must have raised ValueError at construction."""
    real = real_layout(dtype, kwargs.get("backend"))
    collapse = kwargs.get("collapse", False)
    too_large = grid_too_large(comm.size, shape, axes, grid, real, collapse)
    kind, result = outcome(lambda: make(comm, shape, axes=axes, dtype=dtype, grid=grid, **kwargs))
    expected = "ValueError" if too_large else "ok"
    all_ranks_agree(MPI.COMM_WORLD, kind == expected, f"P={comm.size} grid={grid}: {kind} {result}")
    return result if kind == "ok" else None


def check_plan(
    comm, fft, shape, dtype, axes, grid, *, seed=0, input_kind="plain", collapse=False,
    backend=None,
):  # fmt: skip
    """Groups of axes, shapes, dtypes, tiling, forward against numpy, round trip, results in
    the plan's own output arrays (mpi4py-fft); a list of what failed."""
    dtype = np.dtype(dtype)
    real = real_layout(dtype, backend)
    ndim = len(shape)
    axes_ = tuple(range(ndim)) if axes is None else tuple(a % ndim for a in axes)
    pencils = expected_pencils(comm.size, shape, axes_, grid, real, collapse)
    groups, _ = expected_groups(comm.size, shape, axes_, grid, collapse)
    out_dtype = REAL.get(dtype, dtype)
    tol = tolerance(dtype)
    bad = []
    if fft.axes != tuple(tuple(g) for g in groups):
        bad.append(f"axes {fft.axes}, mpi4py-fft has {groups}")
    if fft.global_shape(False) != tuple(shape) or fft.global_shape(True) != pencils[-1][0]:
        bad.append(f"global shapes {fft.global_shape(False)} {fft.global_shape(True)}")
    if fft.dtype(False) != dtype or fft.dtype(True) != out_dtype:
        bad.append(f"dtypes {fft.dtype(False)} {fft.dtype(True)}")
    for forward_output, (gshape, dims) in ((False, pencils[0]), (True, pencils[-1])):
        sl = fft.local_slice(forward_output)
        if tuple(s.stop - s.start for s in sl) != fft.shape(forward_output):
            bad.append(f"local_slice({forward_output}) {sl} vs shape {fft.shape(forward_output)}")
        if not tiles(comm, gshape, dims, sl):
            bad.append(f"local_slice({forward_output}) does not tile {gshape} over {dims}")
    u_global = global_array(shape, dtype, seed)
    mine = u_global[fft.local_slice(False)]
    if input_kind == "plain":
        u = mine.copy()
    else:
        u = newDistArray(fft, forward_output=False)
        u[...] = mine
    u_hat = fft.forward(u)
    ref = reference(u_global, axes_, full=not real) / np.prod([shape[a] for a in axes_])
    if u_hat is not fft.forward.output_array:
        bad.append("forward(u) did not return the plan's forward.output_array")
    if u_hat.shape != fft.shape(True) or u_hat.dtype != out_dtype:
        bad.append(f"forward gave {u_hat.shape} {u_hat.dtype}")
    elif (e := rel_err(u_hat, ref[fft.local_slice(True)])) > tol:
        bad.append(f"forward error {e:.3g}")
    if not np.array_equal(u, mine):
        bad.append("forward changed its input")
    u2 = fft.backward(u_hat)
    if u2 is not fft.backward.output_array:
        bad.append("backward(u_hat) did not return the plan's backward.output_array")
    if u2.shape != fft.shape(False) or u2.dtype != dtype:
        bad.append(f"backward gave {u2.shape} {u2.dtype}")
    elif (e := rel_err(u2, mine)) > tol:
        bad.append(f"round trip error {e:.3g}")
    return bad


# -- forward and round trip against numpy -------------------------------------------------------


@pytest.mark.parametrize("dtype", FFT_DTYPES, ids=dname)
@pytest.mark.parametrize("grid", GRIDS.values(), ids=GRIDS.keys())
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_forward_and_round_trip(world, plans, shape, grid, dtype):
    grid = resolve_grid(grid, world)
    fft = plan_or_error(plans, world, shape, dtype, grid=grid)
    if fft is None:
        return  # the grid is too large at this P: every rank raised ValueError
    kind = "arena" if sum(shape) % 2 else "plain"
    bad = check_plan(world, fft, shape, dtype, None, grid, seed=sum(shape), input_kind=kind)
    all_ranks_agree(world, not bad, f"shape={shape} grid={grid} {np.dtype(dtype)}: {bad}")


AXES_CASES = [
    ((6, 8, 10), (1, 2), None),
    ((10, 8, 6), (-2, -1), (-1,)),
    ((10, 16, 6), (2, 0, 1), None),
    ((10, 16, 6), (2, 0, 1), (-1,)),
    ((9, 10, 13), (2,), None),
    ((9, 10, 13), (0, 2), None),
    ((12, 18), None, None),
    ((12, 18), (1, 0), None),
    ((12, 18), (0,), None),
    ((6, 4), None, None),
    ((5, 6, 7, 4), None, None),
    ((5, 6, 7, 4), (1, 2), (2, -1)),
]


@pytest.mark.parametrize("backend", ["numpy", "pyfftw"])
@pytest.mark.parametrize("dtype", [np.float64, np.complex64], ids=dname)
@pytest.mark.parametrize("grid", [None, (-1,)], ids=["pencil", "slab"])
def test_collapse_gives_the_same_transform(world, plans, grid, dtype, backend):
    """Local axes transformed one call per axis, or several axes per call: both right."""
    if backend != "numpy":
        pytest.importorskip(backend)
    shape, bad = (9, 10, 13), []
    for collapse in (False, True):
        fft = plan_or_error(plans, world, shape, dtype, grid=grid, backend=backend,
                            collapse=collapse)  # fmt: skip
        if fft is not None:
            found = check_plan(world, fft, shape, dtype, None, grid, collapse=collapse,
                               backend=backend)  # fmt: skip
            bad += [f"collapse={collapse}: {b}" for b in found]
    all_ranks_agree(world, not bad, str(bad))


@pytest.mark.parametrize("dtype", [np.float64, np.complex128], ids=dname)
@pytest.mark.parametrize(("shape", "axes", "grid"), AXES_CASES, ids=lambda v: str(v))
def test_axes_and_dimensions(world, plans, shape, axes, grid, dtype):
    if grid is not None and grid[0] == 2 and world.size % 2:
        pytest.skip("grid (2, -1) needs an even number of ranks")
    fft = plan_or_error(plans, world, shape, dtype, axes=axes, grid=grid)
    if fft is None:
        return
    bad = check_plan(world, fft, shape, dtype, axes, grid, seed=len(shape))
    all_ranks_agree(world, not bad, f"shape={shape} axes={axes} grid={grid}: {bad}")


@pytest.mark.parametrize("dtype", [np.float64, np.complex128, np.float32], ids=dname)
def test_normalize_flags(world, plans, dtype):
    shape = (9, 10, 13)
    fft = plans(world, shape, dtype=dtype)
    tol = tolerance(dtype)
    u_global = global_array(shape, dtype, 5)
    ref = reference(u_global, None)
    got = fft.forward(u_global[fft.local_slice(False)].copy(), normalize=False)
    bad = []
    if (e := rel_err(got, ref[fft.local_slice(True)])) > tol:
        bad.append(f"forward(normalize=False) error {e:.3g}")
    # backward(normalize=True) of the unnormalised spectrum is numpy's inverse transform.
    spectrum = ref[fft.local_slice(True)].astype(fft.dtype(True))
    inv = (
        np.fft.irfftn(ref, s=shape, axes=(0, 1, 2))
        if np.dtype(dtype) in REAL
        else np.fft.ifftn(ref)
    )
    back = fft.backward(spectrum, normalize=True)
    if (e := rel_err(back, inv[fft.local_slice(False)])) > tol:
        bad.append(f"backward(normalize=True) error {e:.3g}")
    if (e := rel_err(back, u_global[fft.local_slice(False)])) > tol:
        bad.append(f"backward(normalize=True) vs input {e:.3g}")
    # the defaults: forward normalises, backward does not
    default = fft.backward(fft.forward(u_global[fft.local_slice(False)].copy()))
    if (e := rel_err(default, u_global[fft.local_slice(False)])) > tol:
        bad.append(f"default round trip {e:.3g}")
    all_ranks_agree(world, not bad, f"{np.dtype(dtype)}: {bad}")


# -- results, output arrays, DistArray ----------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float64, np.complex64], ids=dname)
def test_results_are_the_plans_output_arrays(world, plans, dtype):
    """mpi4py-fft's semantics: without output_array a call returns the plan's own output
    array, which the next call overwrites; an output_array given is written and returned,
    and later calls leave it alone. Inputs of the caller are never modified."""
    shape = (8, 6, 5)
    fft = plans(world, shape, dtype=dtype)
    tol = tolerance(dtype)
    sl, sl_hat = fft.local_slice(False), fft.local_slice(True)
    g1, g2 = global_array(shape, dtype, 1), global_array(shape, dtype, 2)
    u1, u2 = g1[sl].copy(), g2[sl].copy()
    ref1 = (reference(g1, None) / np.prod(shape))[sl_hat]
    ref2 = (reference(g2, None) / np.prod(shape))[sl_hat]
    bad = []
    # forward: the plan's output array, overwritten by the next call
    a = fft.forward(u1)
    if a is not fft.forward.output_array:
        bad.append("forward(u1) is not fft.forward.output_array")
    if rel_err(a, ref1) > tol:
        bad.append("forward(u1) wrong")
    b = fft.forward(u2)
    if b is not a:
        bad.append("forward(u2) returned another array than forward(u1)")
    if rel_err(a, ref2) > tol or rel_err(a, ref1) < tol:
        bad.append("forward(u2) did not overwrite the earlier result")
    if not (np.array_equal(u1, g1[sl]) and np.array_equal(u2, g2[sl])):
        bad.append("forward changed its input")
    # mpi4py-fft: the forward output array is the backward input array
    if fft.backward.input_array is not fft.forward.output_array:
        bad.append("backward.input_array is not forward.output_array")
    x = fft.backward()  # transforms the plan's array: the spectrum of u2
    if x is not fft.backward.output_array or rel_err(x, u2) > tol:
        bad.append("backward() of the plan's arrays is not u2")
    # an explicit output array: written, returned, and left alone by later calls
    out_hat = np.full(fft.shape(True), 7, fft.dtype(True))
    if fft.forward(u1, out_hat) is not out_hat or rel_err(out_hat, ref1) > tol:
        bad.append("forward(u1, out_hat) not written or not returned")
    kept_hat = out_hat.copy()
    fft.forward(u2)
    if not np.array_equal(out_hat, kept_hat) or rel_err(fft.forward.output_array, ref2) > tol:
        bad.append("forward(u2) wrote into an earlier explicit output_array")
    out_u = np.full(fft.shape(False), 7, fft.dtype(False))
    if fft.backward(out_hat, out_u) is not out_u or rel_err(out_u, u1) > tol:
        bad.append("backward(out_hat, out_u) not written or not returned")
    if not np.array_equal(out_hat, kept_hat):
        bad.append("backward changed its input")
    kept_u = out_u.copy()
    y = fft.backward(fft.forward(u2))
    if y is not fft.backward.output_array or y is out_u or rel_err(y, u2) > tol:
        bad.append("backward(forward(u2)) is not the plan's array holding u2")
    if not np.array_equal(out_u, kept_u):
        bad.append("a later backward wrote into an earlier explicit output_array")
    # backward without output_array: the plan's array, overwritten by the next call
    x1 = fft.backward(out_hat)
    if x1 is not fft.backward.output_array or rel_err(x1, u1) > tol:
        bad.append("backward(out_hat) is not the plan's array holding u1")
    fft.backward(fft.forward(u2).copy())
    if rel_err(x1, u2) > tol:
        bad.append("a later backward did not overwrite the plan's output array")
    all_ranks_agree(world, not bad, f"{np.dtype(dtype)}: {bad}")


@pytest.mark.parametrize("backend", ["numpy", "pyfftw"])
@pytest.mark.parametrize("out_kind", ["distarray", "plain"])
def test_output_array(world, plans, out_kind, backend):
    if backend != "numpy":
        pytest.importorskip(backend)
    shape = (7, 9, 6)
    options = {"planner_effort": "FFTW_ESTIMATE"} if backend == "pyfftw" else {}
    fft = plans(world, shape, dtype=np.float64, backend=backend, **options)
    u_global = global_array(shape, np.float64, 3)
    u = u_global[fft.local_slice(False)].copy()
    if out_kind == "distarray":
        out_hat = newDistArray(fft, forward_output=True, val=7)
        out_u = newDistArray(fft, forward_output=False, val=7)
    else:
        out_hat = np.full(fft.shape(True), 7, fft.dtype(True))
        out_u = np.full(fft.shape(False), 7, fft.dtype(False))
    ref = reference(u_global, None) / np.prod(shape)
    got = fft.forward(u, out_hat)
    ok = got is out_hat and rel_err(out_hat, ref[fft.local_slice(True)]) < 1e-12
    back = fft.backward(out_hat, output_array=out_u)
    ok &= back is out_u and rel_err(out_u, u) < 1e-12
    all_ranks_agree(world, ok, f"output_array ({out_kind}) not written or not returned")


def test_non_contiguous_input(world, plans):
    """Views (Fortran order, strided) are valid input: only shape and dtype matter."""
    shape = (8, 6, 5)
    fft = plans(world, shape, dtype=np.complex128)
    u_global = global_array(shape, np.complex128, 4)
    mine = u_global[fft.local_slice(False)]
    wide = np.zeros((*mine.shape[:-1], 2 * mine.shape[-1]), mine.dtype)
    wide[..., ::2] = mine
    ref = reference(u_global, None) / np.prod(shape)
    bad = []
    for name, u in (("fortran", np.asfortranarray(mine)), ("strided", wide[..., ::2])):
        kind, got = outcome(lambda u=u: fft.forward(u))
        if kind != "ok":
            bad.append(f"{name}: {kind} {got}")
        elif rel_err(got, ref[fft.local_slice(True)]) > 1e-12:
            bad.append(f"{name}: wrong result")
    all_ranks_agree(world, not bad, str(bad))


def test_dist_array(world, plans):
    shape = (8, 6, 5)
    fft = plans(world, shape, dtype=np.float64)
    ok = True
    for forward_output in (False, True):
        a = newDistArray(fft, forward_output, val=3)
        ok &= isinstance(a, DistArray) and isinstance(a, np.ndarray) and zcoll.is_shared(a)
        ok &= a.shape == fft.shape(forward_output) and a.dtype == fft.dtype(forward_output)
        ok &= a.global_shape == fft.global_shape(forward_output)
        ok &= a.local_slice() == fft.local_slice(forward_output)
        ok &= a.substart == tuple(s.start for s in a.local_slice())
        ok &= bool((a == 3).all())
    u = newDistArray(fft, False)
    ok &= u.alignment == 2 and bool((u == 0).all())
    ok &= newDistArray(fft, True).alignment == 0
    all_ranks_agree(world, ok, "DistArray attributes")


@pytest.mark.parametrize("dtype", [np.complex128, np.float64, np.int32], ids=dname)
def test_dist_array_redistribute(world, plans, dtype):
    shape = (8, 6, 5)
    fft = plans(world, shape, dtype=np.complex128)
    kind = np.complex128 if np.dtype(dtype).kind == "c" else np.float64
    g = (global_array(shape, kind, 6) * 1000).astype(dtype)
    u = newDistArray(fft, False)  # in the arena
    if u.dtype != dtype:
        u = np.zeros_like(
            u, dtype=dtype
        )  # a DistArray of another dtype on the same pencil, not in the arena
    u[...] = g[u.local_slice()]
    bad = []
    for axis in (0, 1, 2, 0, 2):
        v = u.redistribute(axis)
        if not (isinstance(v, DistArray) and v.alignment == axis and v.dtype == u.dtype):
            bad.append(f"redistribute({axis}) gave {type(v).__name__} {v.dtype}")
        elif v.global_shape != shape or not np.array_equal(v, g[v.local_slice()]):
            bad.append(f"redistribute({axis}) wrong data")
        target = np.zeros_like(v)  # a DistArray (not in the arena) on v's pencil
        # out= alone: with `axis` as well, an array already aligned in it returns itself
        v2 = u.redistribute(out=target)
        if v2 is not target or not np.array_equal(target, v):
            bad.append(f"redistribute({axis}, out=) wrong")
        u = v
    all_ranks_agree(world, not bad, str(bad))


def test_timings(world, plans):
    fft = plans(world, (8, 6, 5), dtype=np.complex128)
    fft.reset_timings()
    ok = fft.timings == {"fft": 0.0, "transpose": 0.0}
    u = newDistArray(fft, False, val=1)
    fft.backward(fft.forward(u))
    ok &= fft.timings["fft"] > 0 and fft.timings["transpose"] >= 0
    if world.size > 1:
        ok &= fft.timings["transpose"] > 0
    all_ranks_agree(world, ok, f"timings {fft.timings}")


# -- backends and communicators -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float64, np.complex64], ids=dname)
@pytest.mark.parametrize("backend", ["scipy", "pyfftw"])
def test_backends(world, plans, backend, dtype):
    pytest.importorskip(backend)
    options = {"threads": 1}
    if backend == "pyfftw":
        options["planner_effort"] = "FFTW_ESTIMATE"
    bad = []
    for shape, grid in (((9, 10, 13), None), ((8, 8, 8), (-1,))):
        fft = plan_or_error(plans, world, shape, dtype, grid=grid, backend=backend, **options)
        if fft is None:
            continue
        for seed, kind in ((11, "arena"), (12, "plain")):
            bad += check_plan(world, fft, shape, dtype, None, grid, seed=seed, input_kind=kind,
                              backend=backend)  # fmt: skip
        u_global = global_array(shape, dtype, 13)
        ref = reference(u_global, None, full=not real_layout(dtype, backend))
        got = fft.forward(u_global[fft.local_slice(False)].copy(), normalize=False)
        if (e := rel_err(got, ref[fft.local_slice(True)])) > tolerance(dtype):
            bad.append(f"{shape} forward(normalize=False) error {e:.3g}")
        back = fft.backward(got, normalize=True)
        if (e := rel_err(back, u_global[fft.local_slice(False)])) > tolerance(dtype):
            bad.append(f"{shape} backward(normalize=True) error {e:.3g}")
    all_ranks_agree(world, not bad, f"{backend} {np.dtype(dtype)}: {bad}")


@pytest.mark.parametrize("backend", ["scipy", "pyfftw"])
def test_backends_non_contiguous_arrays(world, plans, backend):
    """Fortran-ordered input and output arrays, on every rank (a local error on some ranks
    only would leave the others waiting in the next transpose)."""
    pytest.importorskip(backend)
    shape = (8, 6, 5)
    fft = plans(world, shape, dtype=np.float64, backend=backend)
    u_global = global_array(shape, np.float64, 4)
    mine = u_global[fft.local_slice(False)]
    ref = reference(u_global, None, full=backend == "scipy") / np.prod(shape)
    kind, got = outcome(lambda: fft.forward(np.asfortranarray(mine)))
    ok = kind == "ok" and rel_err(got, ref[fft.local_slice(True)]) < 1e-12
    all_ranks_agree(world, ok, f"{backend}, Fortran-ordered input: {kind} {got if not ok else ''}")
    out = np.zeros(fft.shape(True), fft.dtype(True), order="F")
    kind, got = outcome(lambda: fft.forward(mine.copy(), out))
    ok = kind == "ok" and got is out and rel_err(out, ref[fft.local_slice(True)]) < 1e-12
    all_ranks_agree(world, ok, f"{backend}, Fortran-ordered output: {kind} {got if not ok else ''}")


@pytest.mark.parametrize("dtype", [np.float64, np.complex128], ids=dname)
def test_communicator_kinds(world, comm, plans, dtype):
    shape = (8, 6, 5)
    fft = plan_or_error(plans, comm, shape, dtype)
    bad = [] if fft is None else check_plan(comm, fft, shape, dtype, None, None, seed=comm.size)
    all_ranks_agree(world, not bad, f"comm size {comm.size}: {bad}")


@pytest.mark.parametrize("order", ["auto", *zcoll.ORDERS])
def test_block_orders(world, plans, order):
    shape = (24, 20, 18)
    fft = plans(world, shape, dtype=np.complex128, order=order)
    bad = check_plan(world, fft, shape, np.complex128, None, None, seed=21, input_kind="arena")
    all_ranks_agree(world, not bad, f"order={order}: {bad}")


@pytest.mark.parametrize("copy", ["auto", *zcoll.COPY_MODES])
def test_larger_array(world, plans, copy):
    """Blocks well past the eager-message threshold, with every copy mode."""
    shape = (64, 48, 40)
    fft = plans(world, shape, dtype=np.float64, copy=copy)
    bad = check_plan(world, fft, shape, np.float64, None, None, seed=22, input_kind="arena")
    all_ranks_agree(world, not bad, str(bad))


def test_plans_interleaved(world, plans):
    """Two live plans on the same communicator, calls interleaved; one destroyed early."""
    a = plans(world, (8, 6, 5), dtype=np.complex128)
    b = plans(world, (9, 10, 13), dtype=np.float32, grid=(-1,))
    c = PFFT(world, (6, 7, 8), dtype=np.float64)
    ga = global_array((8, 6, 5), np.complex128, 31)
    gb = global_array((9, 10, 13), np.float32, 32)
    gc = global_array((6, 7, 8), np.float64, 33)
    ha = a.forward(ga[a.local_slice(False)])
    hc = c.forward(gc[c.local_slice(False)])
    hb = b.forward(gb[b.local_slice(False)])
    ra = a.backward(ha)
    c.destroy()
    rb = b.backward(hb)
    ok = rel_err(ha, (reference(ga, None) / ga.size)[a.local_slice(True)]) < 1e-12
    ok &= rel_err(hb, (reference(gb, None) / gb.size)[b.local_slice(True)]) < 1e-5
    ok &= rel_err(hc, (reference(gc, None) / gc.size)[c.local_slice(True)]) < 1e-12
    ok &= rel_err(ra, ga[a.local_slice(False)]) < 1e-12
    ok &= rel_err(rb, gb[b.local_slice(False)]) < 1e-5
    all_ranks_agree(world, ok, "interleaved plans")


# -- Transfer on its own ------------------------------------------------------------------------


def make_transfer(comm, shape, dtype, axis_a, axis_b, **options):
    """A Transfer by mpi4py-fft's positional signature, the subshapes from the block formula."""
    sub_a, sub_b = list(shape), list(shape)
    cut_b, cut_a = (
        block(shape[axis_b], comm.size, comm.rank),
        block(shape[axis_a], comm.size, comm.rank),
    )
    sub_a[axis_b], sub_b[axis_a] = cut_b.stop - cut_b.start, cut_a.stop - cut_a.start
    return Transfer(comm, shape, dtype, sub_a, axis_a, sub_b, axis_b, **options)


TRANSFER_CASES = [
    ((10, 7, 6), 2, 0),
    ((10, 7, 6), 0, 2),
    ((10, 7, 6), 0, 1),
    ((10, 7, 6), 1, 2),
    ((3, 2, 5), 1, 0),  # fewer elements than ranks: empty blocks at larger P
    ((5, 3, 4, 6), 3, 1),
    ((11, 4), 1, 0),
]
TRANSFER_DTYPES = [np.bool_, np.int8, np.float32, np.complex128]


@pytest.mark.parametrize("copy", ["auto", *zcoll.COPY_MODES])
@pytest.mark.parametrize("mode", ["arena", "plain", "mixed"])
@pytest.mark.parametrize("dtype", TRANSFER_DTYPES, ids=dname)
def test_transfer_matches_global_slices(world, dtype, mode, copy):
    p, r = world.size, world.rank
    bad = []
    for tag, (shape, axis_a, axis_b) in enumerate(TRANSFER_CASES):
        g = random_bytes(tag, int(np.prod(shape)) * np.dtype(dtype).itemsize)
        g = g.view(dtype).reshape(shape)
        t = make_transfer(world, shape, dtype, axis_a, axis_b, copy=copy)
        part_a = [slice(None)] * len(shape)
        part_a[axis_b] = block(shape[axis_b], p, r)
        part_b = [slice(None)] * len(shape)
        part_b[axis_a] = block(shape[axis_a], p, r)
        want_a, want_b = g[tuple(part_a)], g[tuple(part_b)]
        if t.subshape_a != want_a.shape or t.subshape_b != want_b.shape:
            bad.append(f"{shape} {axis_a}->{axis_b}: subshapes {t.subshape_a} {t.subshape_b}")
            continue
        arena_a = mode == "arena" or (mode == "mixed" and r % 2 == 0)
        arena_b = mode == "arena" or (mode == "mixed" and r % 2 == 1)
        a = zcoll.empty(world, want_a.shape, dtype) if arena_a else np.empty(want_a.shape, dtype)
        b = zcoll.empty(world, want_b.shape, dtype) if arena_b else np.empty(want_b.shape, dtype)
        a[...] = want_a
        if t.forward(a, b) is not b or b.tobytes() != want_b.tobytes():
            bad.append(f"{shape} {axis_a}->{axis_b}: forward")
        a[...] = 0
        if t.backward(b, a) is not a or a.tobytes() != want_a.tobytes():
            bad.append(f"{shape} {axis_a}->{axis_b}: backward")
    all_ranks_agree(world, not bad, f"{np.dtype(dtype)} {mode} copy={copy}: {bad}")


@pytest.mark.parametrize("order", ["auto", *zcoll.ORDERS])
def test_transfer_orders_and_communicators(world, comm, order):
    p, r = comm.size, comm.rank
    shape, axis_a, axis_b = (10, 7, 6), 2, 0
    g = np.arange(np.prod(shape), dtype=np.int64).reshape(shape) * 3 + 1
    t = make_transfer(comm, shape, np.int64, axis_a, axis_b, order=order)
    a = zcoll.empty(comm, t.subshape_a, np.int64)
    a[...] = g[block(10, p, r)]
    b = zcoll.empty(comm, t.subshape_b, np.int64)
    t.forward(a, b)
    ok = np.array_equal(b, g[:, :, block(6, p, r)])
    a[...] = -1
    t.backward(b, a)
    ok &= np.array_equal(a, g[block(10, p, r)])
    all_ranks_agree(world, ok, f"Transfer order={order} on a comm of size {p}")


# -- transfer plans: what a plain transfer gives, bit for bit ------------------------------------


def transfer_arrays(comm, shape, axis_a, axis_b, dtype, seed):
    """(source: this rank's part aligned in axis_a, in the arena; an arena array for the result;
    the expected result) of the global array random_bytes(seed) of `shape`."""
    p, r = comm.size, comm.rank
    g = random_bytes(seed, int(np.prod(shape)) * np.dtype(dtype).itemsize).view(dtype)
    g = g.reshape(shape)
    part_a = [slice(None)] * len(shape)
    part_a[axis_b] = block(shape[axis_b], p, r)
    part_b = [slice(None)] * len(shape)
    part_b[axis_a] = block(shape[axis_a], p, r)
    src = zcoll.empty(comm, g[tuple(part_a)].shape, dtype)
    src[...] = g[tuple(part_a)]
    dst = zcoll.empty(comm, g[tuple(part_b)].shape, dtype)
    dst[...] = np.zeros((), dtype)
    return src, dst, g[tuple(part_b)]


def plan_vs_plain(comm, shape, axis_a, axis_b, dtype, seed, **options) -> list[str]:
    """Forward and backward plans against plain transfers, over three runs (plain call, start
    and wait, start and test) with new data written into the source between runs."""
    bad = []
    src, dst, want = transfer_arrays(comm, shape, axis_a, axis_b, dtype, seed)
    ref = zcoll.empty(comm, dst.shape, dtype)
    back = zcoll.empty(comm, src.shape, dtype)
    with (
        transfer_init(comm, src, dst, shape, axis_a, axis_b, **options) as fwd,
        transfer_init(comm, dst, back, shape, axis_b, axis_a, **options) as bwd,
    ):
        for run in range(3):
            if run:
                src[...] = random_bytes(seed + 100 * run, src.nbytes).view(dtype).reshape(src.shape)
            transfer(comm, src, ref, shape, axis_a, axis_b, **options)
            if run == 0:
                got = fwd()
            elif run == 1:
                fwd.start()
                fwd.wait()
                got = fwd.dst
            else:
                fwd.start()
                while not fwd.test():
                    pass
                got = fwd.dst
            if got is not dst or dst.tobytes() != ref.tobytes():
                bad.append(f"{shape} {axis_a}->{axis_b} run {run}: forward differs")
            if run == 0 and dst.tobytes() != want.tobytes():
                bad.append(f"{shape} {axis_a}->{axis_b}: forward differs from the global array")
            bwd()
            if back.tobytes() != src.tobytes():
                bad.append(f"{shape} {axis_a}->{axis_b} run {run}: backward differs")
    return bad


@pytest.mark.parametrize("copy", ["auto", *zcoll.COPY_MODES])
@pytest.mark.parametrize("dtype", TRANSFER_DTYPES, ids=dname)
def test_transfer_plan_matches_transfer(world, dtype, copy):
    bad = []
    for tag, (shape, axis_a, axis_b) in enumerate(TRANSFER_CASES):
        bad += plan_vs_plain(world, shape, axis_a, axis_b, dtype, 40 + tag, copy=copy)
    all_ranks_agree(world, not bad, f"{np.dtype(dtype)} copy={copy}: {bad}")


@pytest.mark.parametrize("order", ["auto", *zcoll.ORDERS])
def test_transfer_plan_orders_and_communicators(world, comm, order):
    bad = []
    for tag, (shape, axis_a, axis_b) in enumerate(TRANSFER_CASES[:4] + TRANSFER_CASES[5:]):
        bad += plan_vs_plain(comm, shape, axis_a, axis_b, np.complex64, 60 + tag, order=order)
    all_ranks_agree(world, not bad, f"order={order} on a comm of size {comm.size}: {bad}")


def test_transfer_plan_rebinding(world, comm):
    """Each rank, alone, runs the plan on its own arrays or on others for one run."""
    shape, axis_a, axis_b, dtype = (10, 7, 6), 0, 2, np.int32
    src, dst, want = transfer_arrays(comm, shape, axis_a, axis_b, dtype, 71)
    other_src = zcoll.empty(comm, src.shape, dtype)
    other_src[...] = src
    other_dst = zcoll.empty(comm, dst.shape, dtype)
    bad = []
    with transfer_init(comm, src, dst, shape, axis_a, axis_b) as plan:
        for run in range(6):
            choice = (comm.rank + run) % 6
            run_src = [None, src, other_src, None, other_src, None][choice]
            run_dst = [None, dst, None, other_dst, other_dst, dst][choice]
            dst[...] = -1
            other_dst[...] = -1
            got = plan(run_src, run_dst)
            into = dst if run_dst is None else run_dst
            if got is not into or into.tobytes() != want.tobytes():
                bad.append(f"run {run} (choice {choice}): wrong result")
            if into is other_dst and (dst != -1).any():
                bad.append(f"run {run} (choice {choice}): the plan's own dst was written")
            plan.start(run_src, run_dst)  # the split run keeps the given arrays until wait
            del run_src, run_dst
            plan.wait()
            if into.tobytes() != want.tobytes():
                bad.append(f"run {run} (choice {choice}): wrong result after start/wait")
    all_ranks_agree(world, not bad, f"comm of size {comm.size}: {bad}")


def test_transfer_plan_object(world):
    shape = (10, 7, 6)
    src, dst, _ = transfer_arrays(world, shape, 2, 0, np.float64, 72)
    plan = transfer_init(world, src, dst, shape, 2, 0, order="column", copy="temporal")
    ok = isinstance(plan, TransferPlan) and plan.src is src and plan.dst is dst
    ok &= plan.shape == list(shape) and (plan.axis_a, plan.axis_b) == (2, 0)
    ok &= plan.order == "column" and plan.copy == "temporal" and not plan.active
    ok &= "TransferPlan" in repr(plan) and "column" in repr(plan)
    other = transfer_init(world, src, dst, shape, 2, 0)
    ok &= other.id != plan.id and other.order in zcoll.ORDERS
    plan.free()
    other.free()
    ok &= plan.freed and "freed" in repr(plan)
    all_ranks_agree(world, ok, repr(plan))


@pytest.mark.parametrize("path", ["cma", "staged"])
def test_transfer_plan_explain_matches_its_runs(world, path):
    """explain() of a transfer plan: its own arrays shared, the ordered path, and `rebinding`
    true to what a run does with a plain destination on every rank (the right result when
    every rank says plain arrays are taken, ValueError on every rank when one says they are
    not; with CMA ruled out, none takes them)."""
    shape = (24, 20, 16)
    src, dst, want = transfer_arrays(world, shape, 2, 0, np.float64, 74)
    with private_buffers_by(world, path), transfer_init(world, src, dst, shape, 2, 0) as plan:
        told = plan.explain()
        plain = np.full(dst.shape, -1.0)
        kind, _ = outcome(lambda: plan(None, plain))
    ok = (told["op"], told["path"], told["src"], told["dst"]) == (
        "transfer",
        "ordered",
        "shared",
        "shared",
    )
    ok &= told["order"] in zcoll.ORDERS and bool(told["why"])
    ok &= told["copied_bytes"] == plan.copied_bytes
    ok &= (told["between_nodes"] is not None) == _context.context(world).multi_node
    ok &= told["rebinding"] in ("shared", "shared or plain")
    # Each rank says what it takes (a rank alone on its node has no peer to pull from); the
    # run refuses on every rank when one of them does not take a plain array.
    if world.allreduce(told["rebinding"] == "shared or plain", op=MPI.LAND):
        ok &= kind == "ok" and plain.tobytes() == want.tobytes()
    else:
        ok &= kind == "ValueError"
    if path == "staged":
        ok &= told["rebinding"] == "shared"
    all_ranks_agree(world, ok, f"{told}, a run on a plain destination: {kind}")


def test_transfer_plan_misuse(world):
    shape = (10, 7, 6)
    src, dst, want = transfer_arrays(world, shape, 2, 0, np.float64, 73)
    plan = transfer_init(world, src, dst, shape, 2, 0)
    plan.start()
    kind, result = outcome(plan.start)  # local: every rank does the same
    ok = kind == "ValueError" and "already active" in str(result) and plan.active
    plan.wait()
    plan.wait()  # nothing active
    ok &= plan.test() and dst.tobytes() == want.tobytes()
    plan.free()
    for use in (plan, plan.start, plan.wait, plan.test):
        kind, result = outcome(use)
        ok &= kind == "ValueError" and "freed" in str(result)
    plan.free()  # idempotent
    with transfer_init(world, src, dst, shape, 2, 0) as scoped:
        scoped()
    ok &= scoped.freed
    all_ranks_agree(world, ok, f"{kind}: {result}")


def test_transfer_plan_after_comm_freed(world):
    dup = world.Dup()
    shape = (10, 7, 6)
    src, dst, want = transfer_arrays(dup, shape, 2, 0, np.int64, 74)
    plan = transfer_init(dup, src, dst, shape, 2, 0)
    plan()
    ok = dst.tobytes() == want.tobytes()
    dup.Free()
    kind, result = outcome(plan)
    ok &= kind == "ValueError" and "closed" in str(result)
    plan.free()
    ok &= plan.freed
    all_ranks_agree(world, ok, f"after comm.Free(): {kind} {result}")


def test_transfer_plan_bad_arguments(world):
    shape, p = (10, 7, 6), world.size
    src, dst, want = transfer_arrays(world, shape, 2, 0, np.float64, 75)
    private = np.empty(src.shape)
    wrong = zcoll.empty(world, (src.shape[0] + 1, *src.shape[1:]), np.float64)
    floats = zcoll.empty(world, dst.shape, np.float32)

    def init(src_on_rank0=src, dst_on_rank0=dst, **options):
        mine = (src_on_rank0, dst_on_rank0) if first(world) else (src, dst)
        return lambda: transfer_init(world, *mine, shape, 2, 0, **options)

    expect_everywhere(world, init(src_on_rank0=private), ValueError, "shared arena")
    expect_everywhere(world, init(src_on_rank0=wrong), ValueError, "shape")
    expect_everywhere(world, init(dst_on_rank0=floats), TypeError)
    expect_everywhere(world, init(src_on_rank0=[1]), TypeError, "numpy.ndarray")
    expect_everywhere(world, init(order="zigzag"), ValueError, "order")
    if p > 1:
        expect_everywhere(world, init(order="row" if first(world) else "column"), ValueError,
                          "order differs")  # fmt: skip
    plan = transfer_init(world, src, dst, shape, 2, 0)
    other = zcoll.empty(world, dst.shape, np.float64)

    def run(src_on_rank0=None, dst_on_rank0=None, dst_elsewhere=None):
        mine = (src_on_rank0, dst_on_rank0) if first(world) else (None, dst_elsewhere)
        return lambda: plan(*mine)

    # A run's own arrays, unfit on rank 0 only: every rank raises, nothing is run.
    expect_everywhere(world, run(dst_on_rank0=wrong), ValueError, "shape")
    expect_everywhere(world, run(src_on_rank0=private), ValueError, "shared arena")
    expect_everywhere(world, run(dst_on_rank0=np.empty(dst.shape), dst_elsewhere=other),
                      ValueError, "shared arena")  # fmt: skip
    expect_everywhere(world, run(src_on_rank0=floats), TypeError, "dtype")
    expect_everywhere(world, run(src_on_rank0="x"), TypeError, "numpy.ndarray")
    expect_everywhere(world, run(src_on_rank0=dst), ValueError)
    if p > 1:
        # Different plans at once, or a plan against a plain call: every rank raises.
        twin = transfer_init(world, src, dst, shape, 2, 0)
        expect_everywhere(world, lambda: (plan if first(world) else twin)(), ValueError,
                          "different persistent plans")  # fmt: skip

        def plan_or_plain():
            if first(world):
                return plan()
            return transfer(world, src, dst, shape, 2, 0)

        expect_everywhere(world, plan_or_plain, ValueError, "different")
        twin.free()
    dst[...] = 0
    plan()
    all_ranks_agree(world, dst.tobytes() == want.tobytes(), "the plan after errors")
    plan.free()


def test_pfft_transposes_are_plans(world, monkeypatch):
    """PFFT's transposes run as the plans it made at construction: no plain transfer call."""
    import zcoll.fft.pencil as pencil

    def no_plain_transfer(*args, **kwargs):
        raise AssertionError("PFFT made a plain transfer call")

    monkeypatch.setattr(pencil, "transfer", no_plain_transfer)
    shape = (9, 10, 13)
    bad = []
    for dtype, grid in ((np.complex128, None), (np.float64, (-1,)), (np.float32, None)):
        fft = plan_or_error(PFFT, world, shape, dtype, grid=grid)
        if fft is None:
            continue
        # stages whose redistribution crosses ranks: each holds its (forward, backward) plans,
        # made by the first call
        steps = [s for s in fft._stages if s.transfer is not None and s.transfer.comm.size > 1]
        if world.size > 1 and not steps:
            bad.append(f"{np.dtype(dtype)} {grid}: no transfer step at P={world.size}")
        if any(s.plans is not None for s in steps):
            bad.append(f"{np.dtype(dtype)} {grid}: plans made before the first call")
        bad += check_plan(world, fft, shape, dtype, None, grid, seed=81, input_kind="arena")
        if any(len(s.plans or ()) != 2 for s in steps) or any(
            not isinstance(p, TransferPlan) for s in steps for p in s.plans or ()
        ):
            bad.append(f"{np.dtype(dtype)} {grid}: a transfer step without its plans")
        bad += check_plan(world, fft, shape, dtype, None, grid, seed=82)
        fft.destroy()
        if any(not p.freed for s in steps for p in s.plans or ()):
            bad.append(f"{np.dtype(dtype)} {grid}: destroy() left a plan")
    all_ranks_agree(world, not bad, str(bad))


def test_transfer_free(world):
    t = make_transfer(world, (10, 7, 6), np.float64, 2, 0)
    a = np.ones(t.subshape_a)
    b = np.empty(t.subshape_b)
    t.forward(a, b)
    ok = bool((b == 1).all())
    t.free()
    t.free()
    kind, result = outcome(lambda: t.forward(a, b))
    ok &= kind == "ValueError" and "freed" in str(result)
    all_ranks_agree(world, ok, f"{kind} {result}")


# -- bad input: the same error on every rank ----------------------------------------------------


def expect_everywhere(comm, fn, exc_type: type, fragment: str = "") -> None:
    kind, result = outcome(fn)
    ok = kind == exc_type.__name__ and fragment in str(result)
    oks = comm.allgather(kind == "ok")
    if all(oks) and isinstance(result, PFFT):
        result.destroy()  # it should not exist, but free it where every rank made one
    all_ranks_agree(comm, ok, f"expected {exc_type.__name__} ({fragment!r}), got {kind}: {result}")


def first(comm) -> bool:
    return comm.rank == 0


def test_bad_transform_arguments(world, plans):
    shape = (8, 6, 5)
    n = np.prod(shape)
    fft = plans(world, shape, dtype=np.float64)
    sl, sl_hat = fft.local_slice(False), fft.local_slice(True)
    good = np.ones(fft.shape(False))
    spectrum = newDistArray(fft, True, val=1)
    # independent references: forward of ones is 1 at the zero mode; backward (unnormalised)
    # of an all-ones half spectrum is irfftn's times n
    ones_hat = np.zeros(fft.global_shape(True), complex)
    ones_hat[0, 0, 0] = 1
    ones_hat = ones_hat[sl_hat]
    ones_back = (np.fft.irfftn(np.ones((8, 6, 3)), s=shape, axes=(0, 1, 2)) * n)[sl]

    def forward_is_ones_hat(fn, what):
        kind, got = outcome(fn)
        ok = kind == "ok" and got is fft.forward.output_array and abs_err(got, ones_hat) < 1e-12
        all_ranks_agree(world, ok, f"{what}: {kind} {got if kind != 'ok' else ''}")

    wrong_shape = np.ones((fft.shape(False)[0] + 1, *fft.shape(False)[1:]))
    expect_everywhere(world, lambda: fft.forward(wrong_shape if first(world) else good),
                      ValueError, "shape")  # fmt: skip
    # input of another dtype is cast when numpy casts it "same_kind" (mpi4py-fft copies it into
    # its input array), on some ranks or all
    forward_is_ones_hat(lambda: fft.forward(good.astype(np.float32) if first(world) else good),
                        "float32 input on rank 0")  # fmt: skip
    forward_is_ones_hat(lambda: fft.forward(good.astype(np.int64)), "int64 input")
    # ... and raises TypeError on every rank when it cannot: complex input to a real plan
    expect_everywhere(world, lambda: fft.forward(good.astype(np.complex128)), TypeError, "dtype")
    expect_everywhere(world, lambda: fft.forward(good.astype(np.complex64) if first(world)
                                                 else good), TypeError, "dtype")  # fmt: skip
    # no input: the plan's input_array is transformed (mpi4py-fft), on some ranks or all
    fft.forward.input_array[...] = 1
    forward_is_ones_hat(lambda: fft.forward(None if first(world) else good), "forward(None)")
    forward_is_ones_hat(fft.forward, "forward()")
    if world.size > 1:
        # forward() (the plan's own arrays: nothing to check) on rank 0, a bad input elsewhere:
        # rank 0 raises the others' error too, at the latest at its first transpose
        expect_everywhere(world, lambda: fft.forward() if first(world)
                          else fft.forward(wrong_shape), ValueError, "shape")  # fmt: skip
    expect_everywhere(world, lambda: fft.forward(good, bogus=1) if first(world)
                      else fft.forward(good), TypeError, "bogus")  # fmt: skip
    bad_out = np.empty((1, 1, 1), fft.dtype(True))
    expect_everywhere(world, lambda: fft.forward(good, bad_out if first(world) else None),
                      ValueError, "output_array")  # fmt: skip
    read_only = np.empty(fft.shape(True), fft.dtype(True))
    read_only.flags.writeable = False
    expect_everywhere(world, lambda: fft.forward(good, read_only if first(world) else None),
                      ValueError, "read-only")  # fmt: skip
    expect_everywhere(world, lambda: fft.forward(good, [0] if first(world) else None),
                      TypeError, "numpy.ndarray")  # fmt: skip
    # a real spectrum casts to complex; an object array cannot be cast: TypeError everywhere
    kind, back = outcome(lambda: fft.backward(spectrum.real if first(world) else spectrum))
    ok = kind == "ok" and back is fft.backward.output_array and abs_err(back, ones_back) < 1e-9
    all_ranks_agree(world, ok, f"backward of a real spectrum on rank 0: {kind}")
    expect_everywhere(world, lambda: fft.backward(spectrum.astype(object) if first(world)
                                                  else spectrum), TypeError, "dtype")  # fmt: skip
    wrong_spectrum = np.ones(fft.shape(False), fft.dtype(True))  # the input's shape
    expect_everywhere(world, lambda: fft.backward(wrong_spectrum if first(world) else spectrum),
                      ValueError, "shape")  # fmt: skip
    expect_everywhere(world, lambda: fft.backward(spectrum, np.empty(fft.shape(False), np.float32)),
                      ValueError, "output_array")  # fmt: skip
    # the plan still works, and gives the right answer, after all that
    u_global = global_array(shape, np.float64, 8)
    ref = reference(u_global, None) / np.prod(shape)
    got = fft.forward(u_global[fft.local_slice(False)].copy())
    all_ranks_agree(world, rel_err(got, ref[fft.local_slice(True)]) < 1e-12, "plan after errors")


def test_plan_without_transposes_raises_locally(world, plans):
    """A plan whose transformed axes are local on every rank never communicates (as
    mpi4py-fft's): a bad input raises on the rank that passed it, the others go on, and the
    plan keeps working."""
    fft = plans(world, (8, 6), axes=(1,), dtype=np.complex128)
    good = np.ones(fft.shape(False), complex)
    expected = np.zeros(fft.shape(True), complex)
    expected[:, 0] = 1  # ones along the transformed axis, normalised: only the zero mode
    kind, got = outcome(lambda: fft.forward(good[:, :1] if first(world) else good))
    ok = kind == "ValueError" if first(world) else kind == "ok" and abs_err(got, expected) < 1e-14
    all_ranks_agree(world, ok, f"{kind}: {got if kind != 'ok' else ''}")
    fft.forward.input_array[...] = 1
    all_ranks_agree(world, abs_err(fft.forward(), expected) < 1e-14, "forward() after the error")
    back = fft.backward()
    all_ranks_agree(world, abs_err(back, good) < 1e-14 and back is fft.backward.output_array,
                    "backward()")  # fmt: skip


def test_bad_plan_arguments(world):
    p = world.size
    expect_everywhere(world, lambda: PFFT(world, (8, 6, 5), dtype=int), TypeError, "dtype")
    expect_everywhere(world, lambda: PFFT(world, (8, 6, 5), dtype=np.float16), TypeError, "dtype")
    expect_everywhere(world, lambda: PFFT(world, (8, 6, 5), backend="fftpack"), ValueError,
                      "backend")  # fmt: skip
    expect_everywhere(world, lambda: PFFT(world, (8, 6, 5), bogus=2), TypeError, "bogus")
    expect_everywhere(world, lambda: PFFT(world, (8, 6, 5), padding=[1.5, 1.5]), ValueError,
                      "padding")  # fmt: skip
    expect_everywhere(world, lambda: PFFT(world, (8, 6, 5), padding=[1.5, 0, 1.5]), ValueError,
                      "padding")  # fmt: skip
    expect_everywhere(world, lambda: PFFT("world", (8, 6, 5)), TypeError, "communicator")
    expect_everywhere(world, lambda: PFFT(world, (8, 6, 5), copy="fast"), ValueError, "copy")
    # one axis: mpi4py-fft's pencils need two; at P > 1 the default grid (1,) cannot fit first
    expect_everywhere(world, lambda: PFFT(world, (8,)), ValueError, "two axes" if p == 1 else "fit")
    expect_everywhere(world, lambda: PFFT(world, (8, 0, 5)), ValueError, "shape")
    expect_everywhere(world, lambda: PFFT(world, (8, 6, 5), axes=(0, 3)), ValueError, "axes")
    expect_everywhere(world, lambda: PFFT(world, (8, 6, 5), axes=((1, -2),)), ValueError, "repeat")
    expect_everywhere(world, lambda: PFFT(world, (8, 6, 5), axes=(1, -2)), ValueError)
    expect_everywhere(world, lambda: PFFT(world, (8, 6, 5), grid=(p + 1,)), ValueError, "fit")
    # the axis transformed first (2) distributed: a fitting grid that puts all ranks there
    if p > 1:
        expect_everywhere(world, lambda: PFFT(world, (8, 6, 5), grid=(1, 1, p)), ValueError,
                          "axis 2")  # fmt: skip
    expect_everywhere(world, lambda: PFFT(world, (8, 6, 5), grid=(1, 1, 2 * p)), ValueError,
                      "fit")  # fmt: skip
    expect_everywhere(world, lambda: PFFT(world, (8, 6, 5), grid=(1, 1, 1, 1)), ValueError,
                      "more entries")  # fmt: skip
    # a grid too large for the data along an axis
    if p > 2:
        expect_everywhere(world, lambda: PFFT(world, (2, 3, 4), grid=(p,)), ValueError, "large")
    else:
        fft = PFFT(world, (2, 3, 4), grid=(p,))
        all_ranks_agree(world, fft.shape(False)[0] == 2 // p)
        fft.destroy()
    if p > 3:  # r2c leaves 3 // 2 + 1 = 2 points along axis 2, distributed over p in the output
        expect_everywhere(world, lambda: PFFT(world, (4, 3, 3), grid=(1, p)), ValueError, "large")
    if p > 1:
        expect_everywhere(world, lambda: PFFT(world, (8, 6, 5), dtype=np.float64, grid=(p, 2)),
                          ValueError, "fit")  # fmt: skip


@pytest.mark.parametrize(
    "options",
    [{"threads": 2}, {"transforms": {}}, {"backend": "numpy", "threads": 1}],
    ids=["threads", "transforms", "numpy-threads"],
)
def test_accepted_plan_options(world, plans, options):
    """mpi4py-fft's keywords are accepted and give the usual transform."""
    shape = (8, 6, 5)
    fft = plans(world, shape, dtype=np.float64, **options)
    bad = check_plan(world, fft, shape, np.float64, None, None, seed=9)
    all_ranks_agree(world, not bad, f"{options}: {bad}")


@pytest.mark.parametrize("dtype", [np.float64, np.complex128], ids=dname)
def test_padding(world, plans, dtype):
    """3/2-rule padding (mpi4py-fft): the input lives on the floor(1.5 n) grid, forward
    truncates to the n-point spectrum, backward zero-pads. A constant is the zero mode."""
    shape, factor = (8, 6, 5), 1.5
    fft = plans(world, shape, dtype=dtype, padding=[factor] * 3)
    padded = tuple(int(np.floor(n * factor)) for n in shape)
    spectral = (*shape[:2], shape[2] // 2 + 1) if np.dtype(dtype) in REAL else shape
    real = np.dtype(dtype) in REAL
    pencils = expected_pencils(world.size, padded, None, None, real)
    bad = []
    if fft.global_shape(False) != padded or fft.global_shape(True) != spectral:
        bad.append(f"global shapes {fft.global_shape(False)} {fft.global_shape(True)}")
    if not tiles(world, padded, pencils[0][1], fft.local_slice(False)):
        bad.append("local_slice(False) does not tile the padded grid")
    if not tiles(world, spectral, pencils[-1][1], fft.local_slice(True)):
        bad.append("local_slice(True) does not tile the spectrum")
    u = np.full(fft.shape(False), 2.5, dtype)
    zero_mode = np.zeros(spectral, REAL.get(np.dtype(dtype), dtype))
    zero_mode[0, 0, 0] = 2.5
    u_hat = fft.forward(u)
    if (e := abs_err(u_hat, zero_mode[fft.local_slice(True)])) > 1e-12:
        bad.append(f"forward of a constant: error {e:.3g}")
    back = fft.backward(u_hat)
    if back.shape != fft.shape(False) or (e := rel_err(back, u)) > 1e-12:
        bad.append(f"backward of the zero mode: {back.shape} error {e:.3g}")
    all_ranks_agree(world, not bad, f"{np.dtype(dtype)}: {bad}")


@pytest.mark.parametrize(
    "slab, grid", [(True, (-1,)), (1, (1, -1)), (-1, (1, 1, -1))], ids=["true", "1", "-1"]
)
def test_slab_keyword(world, plans, slab, grid):
    """mpi4py-fft's deprecated slab=: True is axis (last transformed + 1) % ndim, an int that
    axis, all ranks along it."""
    shape = (12, 10, 9)  # every axis long enough for a slab at P = 8
    axes = (0, 2, 1) if slab == -1 else None  # slab on the axis transformed first is refused
    if slab == -1 and world.size > 1:
        with pytest.raises(ValueError, match="transformed first"):
            zcoll.fft.PFFT(world, shape, dtype=np.complex128, slab=slab)
    fft = plans(world, shape, axes=axes, dtype=np.complex128, slab=slab)
    sizes = [fft.subcomm[ax].Get_size() for ax in range(3)]
    bad = [] if sizes == [world.size if g == -1 else 1 for g in (*grid, 1, 1)[:3]] else [sizes]
    bad += check_plan(world, fft, shape, np.complex128, axes, grid, seed=10)
    all_ranks_agree(world, not bad, str(bad))


def test_slab_with_grid_is_refused(world):
    with pytest.raises(ValueError, match="slab"):
        zcoll.fft.PFFT(world, (8, 6, 5), grid=(-1,), slab=True)
    with pytest.raises(ValueError, match="twice"):
        zcoll.fft.PFFT(world, (8, 6, 5), axes=((0, 1), 1, 2))


def test_plan_arguments_differ_between_ranks(world):
    if world.size == 1:
        pytest.skip("needs two ranks to disagree")
    me = first(world)
    cases = [
        ({"shape": (8, 6, 6) if me else (8, 6, 5)}, ValueError, "disagree"),
        ({"shape": (8, 6) if me else (8, 6, 5)}, ValueError, "disagree"),
        ({"shape": (8, 6, 5), "axes": (0, 2, 1) if me else None}, ValueError, "disagree"),
        ({"shape": (8, 6, 5), "dtype": np.float32 if me else np.float64}, ValueError, "disagree"),
        ({"shape": (8, 6, 5), "grid": (-1,) if me else None}, ValueError, "disagree"),
        ({"shape": (8, 6, 5), "backend": "scipy" if me else "numpy"}, ValueError, "disagree"),
        ({"shape": (8, 6, 5), "order": "row" if me else "auto"}, ValueError, "disagree"),
        (
            {"shape": (8, 6, 5), "copy": zcoll.COPY_MODES[0] if me else "auto"},
            ValueError,
            "disagree",
        ),
        ({"shape": (8, 6, 5), "collapse": me}, ValueError, "disagree"),
        ({"shape": (8, 6, 5), "padding": [1.5] * 3 if me else False}, ValueError, "disagree"),
        ({"shape": (8, 6, 5), "threads": 2 if me else 1}, ValueError, "disagree"),
        # a local error on rank 0 only: its type and rank reach every rank
        ({"shape": (8, 6, 5), "dtype": int if me else np.float64}, TypeError, "[rank 0]"),
        ({"shape": (8, 0, 5) if me else (8, 6, 5)}, ValueError, "[rank 0]"),
    ]
    for kwargs, exc, fragment in cases:
        kwargs = dict(kwargs)
        shape = kwargs.pop("shape")
        expect_everywhere(world, lambda s=shape, k=kwargs: PFFT(world, s, **k), exc, fragment)
    # and a good plan afterwards
    fft = PFFT(world, (8, 6, 5))
    bad = check_plan(world, fft, (8, 6, 5), np.float64, None, None)
    fft.destroy()
    all_ranks_agree(world, not bad, str(bad))


def test_bad_dist_array_arguments(world, plans):
    fft = plans(world, (8, 6, 5), dtype=np.float64)
    expect_everywhere(world, lambda: newDistArray(fft, True, rank=-1), ValueError, "rank=-1")
    u = newDistArray(fft, False, val=1)
    good = np.zeros(fft.pencil[0].pencil(0).subshape)
    wrong = np.zeros((1, *u.shape))
    expect_everywhere(world, lambda: u.redistribute(out=wrong), ValueError, "out")
    if u.commsizes[0] > 1:  # else redistribute(0) only relabels u (mpi4py-fft): nothing to check
        # `out` of the wrong shape on every rank, then on rank 0 only: every rank raises
        expect_everywhere(world, lambda: u.redistribute(0, out=wrong), ValueError, "out")
        # ... then on rank 0 only: every rank of the plan's grid raises (the arrays know the
        # grid's communicator), also those whose exchange does not involve rank 0
        mine = wrong if world.rank == 0 else good
        kind, result = outcome(lambda: u.redistribute(0, out=mine))
        ok = kind == "ValueError" and "out" in str(result) and bool((good == 0).all())
        all_ranks_agree(world, ok, f"redistribute(0, out=) wrong on rank 0 only: {kind}")
    v = u.redistribute(0)
    all_ranks_agree(world, bool((v == 1).all()), "redistribute after errors")


def test_bad_transfer_arguments(world):
    with pytest.raises(ValueError, match="differ"):
        Transfer(world, (4, 4, 4), np.float64, (4, 4, 4), 1, (4, 4, 4), 1)
    with pytest.raises(ValueError, match="order"):
        make_transfer(world, (4, 4, 4), np.float64, 0, 1, order="zigzag")
    with pytest.raises(ValueError, match="range"):
        Transfer(world, (4, 4, 4), np.float64, (4, 4, 4), 0, (4, 4, 4), 3)
    with pytest.raises(ValueError, match="subshapeB"):  # wrong on rank 0 only: every rank raises
        sub_b = (
            (5, 4, 4) if first(world) else make_transfer(world, (4, 4, 4), float, 0, 1).subshapeB
        )
        Transfer(world, (4, 4, 4), float, make_transfer(world, (4, 4, 4), float, 0, 1).subshapeA, 0,
                 sub_b, 1)  # fmt: skip
    t = make_transfer(world, (10, 7, 6), np.float64, 2, 0)
    a = zcoll.empty(world, t.subshape_a, np.float64)
    b = zcoll.empty(world, t.subshape_b, np.float64)
    wrong = zcoll.empty(world, (t.subshape_b[0] + 1, *t.subshape_b[1:]), np.float64)
    expect_everywhere(world, lambda: t.forward(a, wrong if first(world) else b), ValueError)
    wrong_dtype = zcoll.empty(world, t.subshape_b, np.float32)
    expect_everywhere(world, lambda: t.forward(a, wrong_dtype if first(world) else b), TypeError)
    a[...] = 1
    t.forward(a, b)
    all_ranks_agree(world, bool((b == 1).all()), "Transfer after errors")
