"""zcoll.fft.PFFT as mpi4py-fft's PFFT: the object model, every axes/grid/collapse/padding form,
serial backends, real-to-real transforms, vector fields.

Every expectation is computed here independently of zcoll.fft: layouts from mpi4py-fft's rules
written out below, values from numpy/scipy transforms of the global array.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
import scipy.fft
from mpi4py import MPI

from helpers import all_ranks_agree
from helpers.fft import abs_err, collapsed, global_array, rel_err, tiles
from zcoll.fft import PFFT, Subcomm, fftw, newDistArray

TOL = {"f": 2e-5, "d": 1e-11, "g": 1e-11}


def tol(dtype) -> float:
    return TOL[np.dtype(dtype).char.lower()]


def groups_of(axes, ndim: int) -> list[list[int]]:
    if axes is None:
        return [[a] for a in range(ndim)]
    if isinstance(axes, int):
        axes = [axes]
    return [[a % ndim] if isinstance(a, int) else [b % ndim for b in a] for a in axes]


def layout(size, shape, axes, grid, collapse, real, padding=None):
    """mpi4py-fft's (global shape, processes per axis) of the input and output arrays."""
    ndim = len(shape)
    groups = groups_of(axes, ndim)
    original, shape = tuple(shape), list(shape)
    if padding:
        for g in groups:
            if len(g) == 1 and padding[g[0]] > 1:
                shape[g[0]] = int(np.floor(shape[g[0]] * padding[g[0]]))
    if grid is None:
        dims = [0] * ndim
        for a in groups[-1]:
            dims[a] = 1
    else:
        dims = [max(0, g) for g in grid] + [1] * (ndim - len(grid))
    dims = list(MPI.Compute_dims(size, dims))
    if collapse:
        groups = collapsed(groups, dims)
    inp = (tuple(shape), tuple(dims))
    aligned = groups[-1][-1]
    for i, g in enumerate(reversed(groups)):
        if i > 0:
            dims[aligned], dims[g[-1]] = dims[g[-1]], dims[aligned]
            aligned = g[-1]
        ax = g[-1]
        if padding and len(g) == 1 and padding[ax] > 1:
            shape[ax] = original[ax]  # truncated back
        if i == 0 and real:
            shape[ax] = shape[ax] // 2 + 1
    return inp, (tuple(shape), tuple(dims)), groups


def reference(u, groups, real):
    """numpy's unnormalised transform of the global array (real: rfft on the axis
    transformed first)."""
    order = [a for g in groups for a in g]
    if real:
        return np.fft.rfftn(u.astype(np.float64), axes=order)
    return np.fft.fftn(u.astype(np.complex128), axes=order)


def object_model_problems(fft, inp, out, groups) -> list[str]:
    """mpi4py-fft's own assertions on a plan (tests/test_mpifft.py)."""
    bad = []
    f, b = fft.forward, fft.backward
    if fft.dtype(True) != f.output_array.dtype or fft.dtype(False) != f.input_array.dtype:
        bad.append("dtype() disagrees with the arrays")
    if len(fft.axes) != len(fft.xfftn) or len(fft.axes) != len(fft.transfer) + 1:
        bad.append(f"{len(fft.axes)} axes groups, {len(fft.xfftn)} xfftn, {len(fft.transfer)}")
    for t in (f, b):
        if t.input_pencil.subshape != t.input_array.shape:
            bad.append("input pencil and array disagree")
        if t.output_pencil.subshape != t.output_array.shape:
            bad.append("output pencil and array disagree")
    if tuple(fft.global_shape(True)) != f.output_pencil.shape:
        bad.append("global_shape(True)")
    if tuple(fft.global_shape(False)) != f.input_pencil.shape:
        bad.append("global_shape(False)")
    if f.input_pencil.substart[groups[-1][-1]] != 0 or f.output_pencil.substart[groups[0][0]] != 0:
        bad.append("aligned axes do not start at 0")
    if fft.global_shape(False) != inp[0] or fft.global_shape(True) != out[0]:
        bad.append(f"global shapes {fft.global_shape(False)} {fft.global_shape(True)}")
    if fft.dimensions != len(inp[0]):
        bad.append("dimensions")
    return bad


def run_config(comm, make, shape, dtype, axes, grid, collapse, backend, seed=0) -> list[str]:
    real = np.dtype(dtype).kind == "f"
    inp, out, groups = layout(comm.size, shape, axes, grid, collapse, real)
    fft = make(comm, shape, axes=axes, dtype=dtype, grid=grid, collapse=collapse, backend=backend)
    bad = object_model_problems(fft, inp, out, [list(g) for g in fft.axes])
    if [list(g) for g in fft.axes] != groups:
        bad.append(f"axes groups {fft.axes}, mpi4py-fft has {groups}")
    for fo, (gshape, dims) in ((False, inp), (True, out)):
        if not tiles(comm, gshape, dims, fft.local_slice(fo)):
            bad.append(f"local_slice({fo}) is not mpi4py-fft's over {dims}")
    u_global = global_array(shape, dtype, seed)
    u = u_global[fft.local_slice(False)].copy()
    keep = u.copy()
    points = np.prod([shape[a] for g in groups for a in g], dtype=float)
    ref = reference(u_global, groups, real) / points
    ref = ref if out[0] == ref.shape else None
    f_hat = fft.forward(u)
    if f_hat is not fft.forward.output_array:
        bad.append("forward(u) did not return the plan's output_array")
    if ref is not None and (e := rel_err(f_hat, ref[fft.local_slice(True)])) > tol(dtype):
        bad.append(f"forward error {e:.3g}")
    if not np.array_equal(u, keep):
        bad.append("forward changed its input")
    v = fft.backward(f_hat)
    if (e := rel_err(v, keep)) > tol(dtype):
        bad.append(f"round trip error {e:.3g}")
    fft.forward.input_array[...] = keep
    fft.forward()
    fft.backward()
    if (e := rel_err(fft.backward.output_array, keep)) > tol(dtype):
        bad.append(f"round trip on the plan's arrays: error {e:.3g}")
    return bad


DTYPES = ["f", "d", "F", "D"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("collapse", [False, True])
@pytest.mark.parametrize(
    "shape,axes",
    [
        ((12, 13), None),
        ((13, 12), (-1,)),
        ((12, 12), (-2,)),
        ((13, 13), (0, -1)),
        ((12, 13), ((0,), (1,))),
        ((12, 13, 12), None),
        ((13, 12, 13), ((0,), (1, 2))),
        ((12, 13, 13), ((0,), (-2, -1))),
        ((12, 13, 12, 13), ((0,), (1,), (2, 3))),
        ((13, 12, 12, 13), ((0,), (1, 2, 3))),
    ],
)
@pytest.mark.parametrize("slab", [False, True])
def test_layouts_and_values(world, plans, shape, axes, dtype, collapse, slab):
    """mpi4py-fft's test_mpifft sweep (its axes forms and grids, collapse both ways): the
    same pencils as mpi4py-fft, and the transform of numpy."""
    comm = world
    real = dtype in "fd"
    grid = None
    if slab:
        groups = groups_of(axes, len(shape))
        first = (groups[-1][-1] + 1) % len(shape)
        grid = [1] * (first + 1)
        grid[first] = 0
    inp, out, _ = layout(comm.size, shape, axes, grid, collapse, real)
    fits = all(n >= p for s, d in (inp, out) for n, p in zip(s, d))
    if not fits:
        with pytest.raises(ValueError):
            plans(comm, shape, axes=axes, dtype=dtype, grid=grid, collapse=collapse)
        return
    bad = run_config(comm, plans, shape, dtype, axes, grid, collapse, "numpy")
    all_ranks_agree(MPI.COMM_WORLD, not bad, f"P={comm.size} {shape} {axes} {grid}: {bad}")


@pytest.mark.parametrize("backend", ["fftw", "pyfftw", "numpy", "scipy"])
@pytest.mark.parametrize("dtype", ["d", "D", "f"])
def test_backends(world, plans, backend, dtype):
    if backend == "scipy" and dtype in "fd":
        pytest.skip("mpi4py-fft's scipy backend transforms real input as complex: see below")
    bad = run_config(world, plans, (12, 13, 12), dtype, None, None, False, backend)
    all_ranks_agree(MPI.COMM_WORLD, not bad, f"{backend} {dtype}: {bad}")


@pytest.mark.parametrize("backend", ["fftw", "numpy"])
@pytest.mark.parametrize("dtype", ["g", "G"])
def test_long_double(world, plans, backend, dtype):
    bad = run_config(world, plans, (12, 13, 12), dtype, None, None, False, backend)
    all_ranks_agree(MPI.COMM_WORLD, not bad, f"{backend} {dtype}: {bad}")


def test_scipy_backend_real_input_is_complex(world, plans):
    """mpi4py-fft's scipy backend has no real transform: real input gives a full complex
    spectrum; zcoll keeps its layout."""
    fft = plans(world, (12, 13, 12), dtype="d", backend="scipy")
    all_ranks_agree(
        MPI.COMM_WORLD,
        fft.global_shape(True) == (12, 13, 12) and fft.dtype(True).kind == "c",
        f"{fft.global_shape(True)} {fft.dtype(True)}",
    )


@pytest.mark.parametrize("backend", ["fftw", "numpy"])
@pytest.mark.parametrize("dtype", ["d", "f"])
def test_padding(world, plans, dtype, backend):
    """3/2 rule: a mode on the padded grid comes out in the truncated spectrum, scaled as in
    mpi4py-fft; backward(forward(v)) gives v back for band-limited v. With 'fftw' the
    no-argument calls run the plans bound to padded work arrays (FFT.bind)."""
    comm = world
    n = 12
    padding = [1.5, 1.5, 1.5]
    fft = plans(comm, (n, n, n), dtype=dtype, padding=padding, backend=backend)
    m = int(n * 1.5)
    inp, out, groups = layout(comm.size, (n, n, n), None, None, False, True, padding)
    bad = object_model_problems(fft, inp, out, [list(g) for g in fft.axes])
    x = [np.arange(m)[s] * 2 * np.pi / m for s in fft.local_slice(False)]
    u = np.cos(x[0])[:, None, None] * np.cos(2 * x[1])[None, :, None] * np.cos(3 * x[2])
    u = np.ascontiguousarray(np.broadcast_to(u, fft.shape(False)), dtype=dtype)
    f_hat = fft.forward(u).copy()
    spectrum = np.zeros((n, n, n // 2 + 1), complex)
    for kx, ky in itertools.product((1, -1), (2, -2)):
        spectrum[kx, ky, 3] = 1 / 8
    if (e := abs_err(f_hat, spectrum[fft.local_slice(True)])) > tol(dtype):
        bad.append(f"forward error {e:.3g}")
    v = fft.backward(f_hat)
    if (e := abs_err(v, u)) > tol(dtype):
        bad.append(f"backward error {e:.3g}")
    again = fft.forward(v)
    if (e := abs_err(again, f_hat)) > tol(dtype):
        bad.append(f"forward(backward(F)) error {e:.3g}")
    for _ in range(2):  # the no-argument calls, twice: their steps are made on the first
        fft.forward.input_array[...] = u
        if (e := abs_err(fft.forward(), spectrum[fft.local_slice(True)])) > tol(dtype):
            bad.append(f"forward() error {e:.3g}")
        if (e := abs_err(fft.backward(), u)) > tol(dtype):
            bad.append(f"backward() error {e:.3g}")
    fft.backward.input_array[...] = f_hat
    fft.backward(normalize=True)
    fft.forward(normalize=False)
    if (e := abs_err(fft.forward.output_array, f_hat)) > tol(dtype):
        bad.append(f"normalize on backward instead: error {e:.3g}")
    all_ranks_agree(MPI.COMM_WORLD, not bad, f"{bad}")


def test_real_to_real_transforms(world, plans):
    """mpi4py-fft's test_r2r: DCT-III over axes (1, 2), DST-III over (3, 4), slabs; values
    against scipy.fft of the global array."""
    comm = world
    shape = (5, 6, 7, 8, 9)
    if comm.size >= 6:
        pytest.skip("shape (5, ...) needs fewer than 6 ranks, as in mpi4py-fft's test")
    dct = functools.partial(fftw.dctn, type=3)
    idct = functools.partial(fftw.idctn, type=3)
    dst = functools.partial(fftw.dstn, type=3)
    idst = functools.partial(fftw.idstn, type=3)
    fft = plans(comm, shape, axes=((0,), (1, 2), (3, 4)), grid=(-1,),
                transforms={(1, 2): (dct, idct), (3, 4): (dst, idst)})  # fmt: skip
    u_global = global_array(shape, "d", 3)
    u = u_global[fft.local_slice(False)].copy()
    f_hat = fft.forward(u, normalize=False).copy()
    ref = scipy.fft.dstn(u_global, type=3, axes=(3, 4))
    ref = scipy.fft.dctn(ref, type=3, axes=(1, 2))
    ref = np.fft.fft(ref, axis=0)
    bad = []
    if (e := rel_err(f_hat, ref[fft.local_slice(True)])) > 1e-11:
        bad.append(f"forward error {e:.3g}")
    c = fft.backward(fft.forward(u), np.empty_like(u))
    if (e := rel_err(c, u)) > 1e-11:
        bad.append(f"round trip error {e:.3g}")
    all_ranks_agree(MPI.COMM_WORLD, not bad, f"{bad}")


@pytest.mark.parametrize("components", ["auto", "fused", "separate"])
@pytest.mark.parametrize("dtype", ["d", "D"])
@pytest.mark.parametrize("rank", [1, 2])
def test_vector_fields(world, plans, dtype, rank, components):
    """A rank-1/2 field goes through in one call; equal to one transform per component, also
    into the plan's own output array."""
    fft = plans(world, (12, 13, 10), dtype=dtype, backend="numpy", components=components)
    u = newDistArray(fft, False, rank=rank)
    lead = u.shape[:rank]
    rng = np.random.default_rng(world.rank)
    u[...] = rng.standard_normal(u.shape)
    u_hat = newDistArray(fft, True, rank=rank)
    fft.forward(u, u_hat)
    bad = []
    for idx in np.ndindex(*lead):
        one = fft.forward(np.asarray(u[idx]))
        if (e := rel_err(u_hat[idx], one)) > 1e-13:
            bad.append(f"component {idx}: error {e:.3g}")
    back = newDistArray(fft, False, rank=rank)
    fft.backward(u_hat, back)
    if (e := rel_err(back, u)) > tol(dtype):
        bad.append(f"round trip error {e:.3g}")
    own = fft.forward(u)  # no output array: the plan's own, with the leading axes
    if own.shape != u_hat.shape:
        bad.append(f"forward into the plan's array: shape {own.shape}")
    elif (e := rel_err(own, u_hat)) > 1e-13:
        bad.append(f"forward into the plan's array: error {e:.3g}")
    all_ranks_agree(MPI.COMM_WORLD, not bad, f"{bad}")


def test_bad_components_mode(world):
    with pytest.raises(ValueError, match="components"):
        PFFT(world, (8, 6, 5), components="interleaved")


def test_subcomm_as_comm_and_darray(world, plans):
    comm = world
    dims = [0, 0, 1]
    sub = Subcomm(comm, dims)
    fft = plans(sub, (12, 13, 12), dtype="D", backend="numpy")
    a = newDistArray(fft, False)
    a[...] = global_array((12, 13, 12), "D", 5)[a.local_slice()]
    g = plans(comm, darray=a, backend="numpy")
    bad = []
    if g.local_slice(False) != fft.local_slice(False) or g.local_slice(True) != fft.local_slice(
        True
    ):
        bad.append("PFFT(darray=) has another layout")
    if (e := rel_err(g.forward(a), fft.forward(a))) > 1e-13:
        bad.append(f"PFFT(darray=) transform differs: {e:.3g}")
    all_ranks_agree(MPI.COMM_WORLD, not bad, f"{bad}")


def test_bad_arguments_raise_on_every_rank(world, plans):
    comm = world
    cases = [
        (dict(axes=(0, 3)), ValueError),
        (dict(axes=(0, 0)), ValueError),
        (dict(dtype=np.int32), TypeError),
        (dict(padding=[1.5, 1.5]), ValueError),
        (dict(no_such_option=1), TypeError),
        (dict(backend="nope"), ValueError),
    ]
    for kwargs, kind in cases:
        with pytest.raises(kind):
            plans(comm, (8, 8, 8), **kwargs)
    fft = plans(comm, (8, 8, 8), dtype="d", backend="numpy")
    with pytest.raises(ValueError):
        fft.forward(np.zeros((3, 3)))
    with pytest.raises(TypeError):
        fft.forward(np.zeros(fft.shape(False)), bogus=True)
    with pytest.raises(ValueError):
        fft.forward(np.zeros(fft.shape(False)), np.zeros((1, 1), complex))
