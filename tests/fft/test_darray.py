"""zcoll.fft.DistArray and newDistArray against mpi4py-fft's semantics.

Ports what mpi4py-fft's tests/test_darray.py and examples/darray.py check, with the data
compared against a global array made on every rank (not only norms): layouts against the
block-distribution formula, redistribute both ways for tensor ranks 0, 1 and 2, get(), views
and their types, arena memory, and bad arguments raising on every rank.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from mpi4py import MPI

import zcoll
from helpers import all_ranks_agree
from helpers.pencil import block, count_plan_runs, expect_everywhere, global_array, tiles
from zcoll.fft import PFFT, DistArray
from zcoll.fft.distarray import Function, newDistArray
from zcoll.fft.pencil import Subcomm


def layout_ok(a: DistArray) -> bool:
    """substart/shape of every axis from the block formula, and the blocks tile the array."""
    ok = True
    for k, (n, c) in enumerate(zip(a.global_shape, a.subcomm)):
        count, start = block(n, c.Get_size(), c.Get_rank())
        ok &= a.shape[k] == count and a.substart[k] == start
        ok &= a.local_slice()[k] == slice(start, start + count)
    return ok and tiles(MPI.COMM_WORLD, a.global_shape, a.local_slice())


def fill(a: DistArray, g: np.ndarray) -> None:
    a[...] = g[a.local_slice()]


def holds(a: DistArray, g: np.ndarray) -> bool:
    return a.global_shape == g.shape and np.array_equal(a, g[a.local_slice()])


def test_1d_array(world):
    z = DistArray((8,), val=2)
    ok = z[0] == 2 and z.shape == (8,) and z.rank == 0 and bool((z == 2).all())
    v = DistArray((2, 8), val=1, rank=1)  # one distributed axis: not distributed
    ok &= v.shape == (2, 8) and v.rank == 1
    g = z.get((slice(1, 4),))
    ok &= (g is None) if world.rank else np.array_equal(g, [2, 2, 2])
    all_ranks_agree(world, ok, "1D DistArray")


SUBCOMMS_2D = [(0, 1), (1, 0), None, "Subcomm"]
SUBCOMMS_3D = [(0, 0, 1), (0, 1, 0), (1, 0, 0), (0, 1, 1), (1, 0, 1), (1, 1, 0), None, "Subcomm"]


def make_subcomm(spec, ndim):
    if spec == "Subcomm":
        return Subcomm(MPI.COMM_WORLD, (0,) * (ndim - 1) + (1,))
    return spec


def same_memory(view: np.ndarray, array: np.ndarray) -> bool:
    """`view` starts where `array` does (also for the empty part of a rank that holds none
    of an axis, where np.shares_memory is always False)."""
    start = view.__array_interface__["data"][0]
    return start == array.__array_interface__["data"][0] and (
        array.size == 0 or np.shares_memory(view, array)
    )


@pytest.mark.parametrize("rank", [0, 1, 2])
@pytest.mark.parametrize(("N", "spec"), [((8, 7), s) for s in SUBCOMMS_2D]
                         + [((8, 7, 6), s) for s in SUBCOMMS_3D], ids=str)  # fmt: skip
def test_darray(world, N, spec, rank):
    """mpi4py-fft's test_2Darray / test_3Darray, against the global array."""
    dim = len(N)
    M = (dim,) * rank + N
    alignment = dim - 1 if spec is None and rank == 1 else None
    subcomm = make_subcomm(spec, dim)
    a = DistArray(M, subcomm=subcomm, val=1, rank=rank, alignment=alignment)
    bad = []
    if a.rank != rank or a.global_shape != M or a.dimensions != dim:
        bad.append(f"rank {a.rank} global_shape {a.global_shape}")
    if int(np.prod(a.commsizes)) != world.size or len(a.subcomm) != len(M):
        bad.append(f"commsizes {a.commsizes}")
    if not layout_ok(a):
        bad.append(f"layout {a.shape} {a.substart}")
    if not zcoll.is_shared(a):  # None, ints and a Subcomm all give a grid communicator
        bad.append("not in the arena")
    if not bool((a == 1).all()):
        bad.append("val")
    if rank > 0:
        a0 = a[0]
        if not (isinstance(a0, DistArray) and a0.rank == rank - 1 and a0.pencil is a.pencil):
            bad.append("a[0]")
    if rank == 2:
        a01 = a[0, 1]
        if not (isinstance(a01, DistArray) and a01.rank == 0):
            bad.append("a[0, 1]")
    if type(a.v) is not np.ndarray or a.v.shape != a.shape or not same_memory(a.v, a):
        bad.append("a.v")
    g = global_array(M, np.float64, dim + rank)
    fill(a, g)
    for gslice in [(0,) * rank + (0, slice(None)) + (0,) * (dim - 2),
                   (0,) * rank + (slice(None),) + (0,) * (dim - 1),
                   (slice(None),) * rank + (slice(None),) * dim,
                   (-1,) * rank + (slice(1, None, 2), 3) + (slice(None),) * (dim - 2)]:  # fmt: skip
        k = a.get(gslice)
        if world.rank != 0 and k is not None:
            bad.append(f"get {gslice} on rank {world.rank}")
        elif world.rank == 0 and not (isinstance(k, np.ndarray) and np.array_equal(k, g[gslice])):
            bad.append(f"get {gslice}")
    newaxis = (a.alignment + 1) % dim
    p, t = a.get_pencil_and_transfer(newaxis)
    if p.axis != newaxis or t.subshapeA != a.pencil.subshape or t.subshapeB != p.subshape:
        bad.append("get_pencil_and_transfer")
    b = a.redistribute(newaxis)
    if b.alignment != newaxis or b.rank != rank or not holds(b, g) or not layout_ok(b):
        bad.append(f"redistribute({newaxis})")
    if b is not a:  # else newaxis was not distributed: a is only relabelled (mpi4py-fft)
        a[...] = 0
    a2 = b.redistribute(out=a)
    if a2 is not a or not holds(a, g):
        bad.append("redistribute(out=a)")
    a3 = b.redistribute(a.alignment, out=a)
    if a3 is not a or not holds(a, g):
        bad.append("redistribute(a.alignment, out=a)")
    if a.redistribute(a.alignment) is not a:
        bad.append("redistribute(a.alignment) is not a")
    t.destroy()
    if spec == "Subcomm":
        subcomm.destroy()
    all_ranks_agree(world, not bad, f"{M} {spec}: {bad}")


def test_examples_darray(world):
    """mpi4py-fft's examples/darray.py (its DistArray parts), against the global arrays."""
    bad = []
    N = (16, 14, 12)
    g = global_array(N, np.float64, 1)
    z0 = DistArray(N, dtype=float, alignment=0)
    fill(z0, g)
    z1 = z0.redistribute(2)
    z2 = z1.redistribute(1)
    if not (holds(z1, g) and holds(z2, g) and z2.alignment == 1):
        bad.append("16x14x12")
    N = (6, 6, 6)
    z = DistArray(N, dtype=float, alignment=0)
    z[:] = world.rank
    g0 = z.get((0, slice(None), 0))
    z2 = z.redistribute(2)
    z = z2.redistribute(out=z)
    g1 = z.get((0, slice(None), 0))
    owners = world.allgather((z.local_slice(), world.rank))  # z[0, j, 0] is its owner's rank
    want = np.zeros(6)
    for sl, r in owners:
        if sl[0].start == 0 and sl[2].start == 0:
            want[sl[1]] = r
    if world.rank == 0 and not (np.array_equal(g0, g1) and np.array_equal(g0, want)):
        bad.append(f"get {g0} {g1} {want}")
    N = (3, 3, 6, 6, 6)
    g = global_array(N, np.float64, 2)
    z2 = DistArray(N, dtype=float, val=1, alignment=2, rank=2)
    fill(z2, g)
    z1 = z2.redistribute(1)
    z0 = z1.redistribute(0)
    if not (holds(z1, g) and holds(z0, g)):
        bad.append("rank 2")
    # (z1 is z2, or z0 is z1, where the new alignment is not distributed: only relabelled)
    if z1 is not z0:
        z1[...] = 0
    z1 = z0.redistribute(out=z1)
    if z0 is not z1:
        z0[...] = 0
    z0 = z1.redistribute(out=z0)
    if not (holds(z1, g) and holds(z0, g)):
        bad.append("rank 2 out=")
    N = (6, 6, 6, 6, 6)
    g = global_array(N, np.float64, 3)
    m0 = DistArray(N, dtype=float, alignment=2)
    fill(m0, g)
    m1 = m0.redistribute(4)
    if m1 is not m0:
        m0[...] = 0
    m0 = m1.redistribute(out=m0)
    if not (holds(m1, g) and holds(m0, g) and m1.alignment == 4):
        bad.append("5D")
    all_ranks_agree(world, not bad, str(bad))


@pytest.mark.parametrize("rank", [1, 2])
def test_redistribute_components_fused(world, monkeypatch, rank):
    """All components of a rank > 0 array move in one transfer, as each alone would."""
    N = (3,) * rank + (9, 8, 7)
    g = global_array(N, np.complex128, 5)
    a = DistArray(N, subcomm=(0, 0, 1), dtype=np.complex128, rank=rank)
    fill(a, g)
    axis = 0 if a.commsizes[rank] > 1 else 1
    a.redistribute(axis)  # the transfer and its work arrays are made (collectively)
    runs = count_plan_runs(monkeypatch)
    b = a.redistribute(axis)
    ok = holds(b, g) and b.alignment == axis
    if a.commsizes[rank + axis] > 1:
        ok &= runs[0] == 1
    parts = [a[k].redistribute(axis) for k in np.ndindex(*N[:rank])]
    ok &= all(np.array_equal(p, b[k]) for p, k in zip(parts, np.ndindex(*N[:rank])))
    all_ranks_agree(world, ok, f"fused redistribute, rank {rank}, runs {runs[0]}")


def test_redistribute_relabels_undistributed_axes(world):
    """An axis no process splits: redistribute only changes the alignment (mpi4py-fft)."""
    a = DistArray((6, 5, 4), subcomm=(0, 1, 1), val=2)
    b = a.redistribute(1)
    ok = b is a and a.alignment == 1 and a.shape == (block(6, world.size, world.rank)[0], 5, 4)
    ok &= a.redistribute(-1) is a and a.alignment == 2
    all_ranks_agree(world, ok, "relabel")


def test_plain_subcomm_tuple_uses_ordinary_memory(world):
    """A plain tuple of communicators has no grid communicator: ordinary memory, staged."""
    sub = Subcomm(world, (0, 1))
    g = global_array((7, 9), np.float64, 9)
    a = DistArray((7, 9), subcomm=tuple(sub), alignment=1)
    ok = not zcoll.is_shared(a) and a.pencil.comm is None and layout_ok(a)
    fill(a, g)
    b = a.redistribute(0)
    ok &= holds(b, g) and not zcoll.is_shared(b)
    if b is not a:  # P = 1: axis 0 is not distributed, a is only relabelled
        a[...] = 0
    ok &= b.redistribute(out=a) is a and holds(a, g)
    all_ranks_agree(world, ok, "plain tuple")
    sub.destroy()


def test_indexing_and_ufuncs(world):
    """Views are DistArrays only where mpi4py-fft's are; ufunc results keep the layout."""
    s = DistArray((8, 6), val=1)
    v = DistArray((2, 8, 6), val=1, rank=1)
    ok = type(s[0]) is np.ndarray and type(s[0:2]) is np.ndarray and type(s[:, 0]) is np.ndarray
    ok &= type(s[...]) is np.ndarray
    ok &= isinstance(v[0], DistArray) and v[0].rank == 0
    ok &= isinstance(v[0:1], DistArray) and v[0:1].rank == 1
    ok &= type(v[0, 0]) is np.ndarray and type(v[0, :, 0]) is np.ndarray
    t = s + 1
    ok &= isinstance(t, DistArray) and t.pencil is s.pencil and bool((t == 2).all())
    ok &= isinstance(np.zeros_like(v), DistArray) and np.zeros_like(v).rank == 1
    ok &= isinstance(s.copy(), DistArray) and s.copy().alignment == s.alignment
    all_ranks_agree(world, ok, "indexing")


def test_new_dist_array(world):
    """mpi4py-fft's test_newDistArray (without PFFT(darray=)), checked against the PFFT."""
    N = (8, 7, 6)
    fft = PFFT(world, N)
    ok = True
    for forward_output in (True, False):
        for view in (True, False):
            for rank in (0, 1, 2):
                a = newDistArray(fft, forward_output=forward_output, rank=rank, view=view)
                z = a.base if view else a
                ok &= type(a) is (np.ndarray if view else DistArray)
                ok &= isinstance(z, DistArray) and z.rank == rank and zcoll.is_shared(z)
                ok &= z.global_shape == (3,) * rank + fft.global_shape(forward_output)
                ok &= z.shape == (3,) * rank + fft.shape(forward_output)
                ok &= z.dtype == fft.dtype(forward_output) and bool((z == 0).all())
                ok &= z.local_slice()[rank:] == fft.local_slice(forward_output)
    fft.destroy()
    all_ranks_agree(world, ok, "newDistArray")


def test_new_dist_array_takes_a_pencil_list(world):
    """mpi4py-fft's PFFT has ``pencil = [input_pencil, output_pencil]`` (so has zcoll's now); an
    object with a ``pencil(forward_output)`` method works too."""
    fft = PFFT(world, (8, 7, 6))

    class ListPFFT:
        def pencil(self, forward_output):
            return fft.pencil[int(forward_output)]

        global_shape = staticmethod(fft.global_shape)
        dtype = staticmethod(fft.dtype)

    ok = True
    for fo in (False, True):
        a, b = newDistArray(ListPFFT(), fo, val=3, rank=1), newDistArray(fft, fo, val=3, rank=1)
        ok &= a.shape == b.shape and a.local_slice() == b.local_slice() and a.dtype == b.dtype
        ok &= bool((a == 3).all()) and a.alignment == b.alignment
    fft.destroy()
    all_ranks_agree(world, ok, "pencil list")


def test_function_is_deprecated(world):
    fft = PFFT(world, (8, 7, 6))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        v = Function(fft, False, tensor=3)
    ok = any(issubclass(w.category, FutureWarning) for w in caught) and v.rank == 1
    fft.destroy()
    all_ranks_agree(world, ok, "Function")


def test_file_io_needs_parallel_libraries(world, tmp_path):
    from zcoll.fft import io

    try:
        import h5py

        parallel = bool(h5py.get_config().mpi)
    except ImportError:
        parallel = False
    if parallel:
        pytest.skip("h5py with MPI is installed: the io classes are usable")
    a = DistArray((8, 6), val=1)
    for fn, fragment in [
        (lambda: io.HDF5File(str(tmp_path / "a.h5")), "h5py"),
        (lambda: a.write(str(tmp_path / "a.h5"), "u"), "MPI"),
        (lambda: a.read(str(tmp_path / "a.h5"), "u"), "h5py"),
        (lambda: a.write(str(tmp_path / "a.nc"), "u"), "netCDF4"),
        (lambda: io.NCFile(str(tmp_path / "a.nc")), "parallel"),
    ]:
        expect_everywhere(world, fn, ImportError, fragment)
    all_ranks_agree(world, not list(tmp_path.iterdir()), "no file written")


def test_bad_arguments(world):
    p = world.size
    expect_everywhere(world, lambda: DistArray((8, 6), subcomm=(0, 1, 1)), ValueError, "entries")
    expect_everywhere(world, lambda: DistArray((8, 6), subcomm=5), TypeError, "subcomm")
    expect_everywhere(world, lambda: DistArray((8, 6), rank=3), ValueError, "rank")
    if p > 1:
        expect_everywhere(world, lambda: DistArray((8, 6), subcomm=(0, 1), alignment=0),
                          ValueError, "alignment")  # fmt: skip
    a = DistArray((8, 6), subcomm=(0, 1), val=1)
    other = DistArray((8, 5), subcomm=(0, 1), alignment=1)
    expect_everywhere(world, lambda: a.redistribute(out=other), ValueError, "global shape")
    expect_everywhere(world, lambda: a.redistribute(), ValueError, "axis or out")
    # `out` wrong on rank 0 only: every rank of the grid raises, also where the transfer runs
    # on part of the grid only (a 3D grid at P = 4: sub-communicators of 2 ranks)
    for x in (a, DistArray((8, 6, 4), subcomm=(0, 0, 1), val=1)):
        if x.commsizes[0] == 1:
            continue
        good = x.redistribute(0)
        wrong = np.zeros((good.shape[0] + 1, *good.shape[1:]))
        mine = wrong if world.rank == 0 else np.zeros(good.shape)
        expect_everywhere(world, lambda x=x, mine=mine: x.redistribute(0, out=mine), ValueError,
                          "out")  # fmt: skip
        b = x.redistribute(0)
        all_ranks_agree(world, bool((b == 1).all()), "redistribute after errors")


def test_ranks_without_data(world):
    """An axis shorter than the processes along it (mpi4py-fft asserts; zcoll allows it):
    some ranks hold empty blocks, and redistribute still gives the global array."""
    g = global_array((2, 9, 3), np.float64, 4)
    a = DistArray(g.shape, subcomm=(0, 1, 1), alignment=2)
    fill(a, g)
    b = a.redistribute(0) if a.commsizes[0] > 1 else a.redistribute(1)
    c = b.redistribute(out=DistArray(g.shape, subcomm=(0, 1, 1), alignment=2))
    ok = layout_ok(a) and holds(b, g) and holds(c, g)
    k = a.get((slice(None), 4, slice(None)))
    ok &= (k is None) if world.rank else np.array_equal(k, g[:, 4, :])
    all_ranks_agree(world, ok, "ranks without data")


def test_round_trips_share_pencils_and_transfers(world):
    """u -> v -> u again: the same pencils, so the transfers (and work arrays) are made once."""
    g = global_array((8, 6, 4), np.float64, 6)
    a = DistArray(g.shape, subcomm=(0, 0, 1))
    fill(a, g)
    if a.commsizes[0] == 1:
        pytest.skip("axis 0 is not distributed: redistribute(0) only relabels")
    u = a
    for _ in range(3):
        v = u.redistribute(0)
        u = v.redistribute(2)
    ok = u.pencil is a.pencil and v.pencil is a.pencil.pencil(0) and holds(u, g) and holds(v, g)
    ok &= len(a.pencil._transfers) == 1 and len(v.pencil._transfers) == 1
    all_ranks_agree(world, ok, "round trips")
