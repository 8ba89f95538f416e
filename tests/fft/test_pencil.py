"""zcoll.fft.pencil against mpi4py-fft's semantics: Subcomm, Pencil and Transfer.

Ports what mpi4py-fft's tests/test_pencil.py checks, and more: every rank's subshape and
substart against the block-distribution formula (computed here), transfers against slices of
a global array made on every rank, fused components against per-component transfers, and bad
arguments raising on every rank.
"""

from __future__ import annotations

from itertools import product

import numpy as np
import pytest
from mpi4py import MPI

import zcoll
from helpers import PRIVATE_PATHS, all_ranks_agree, private_buffers_by
from helpers.pencil import block, count_plan_runs, expect_everywhere, global_array, tiles
from zcoll.fft.pencil import Pencil, Subcomm, Transfer


def expected_layout(p: Pencil) -> tuple[tuple[int, ...], tuple[int, ...]]:
    shares = [block(n, c.Get_size(), c.Get_rank()) for n, c in zip(p.shape, p.subcomm)]
    return tuple(n for n, _ in shares), tuple(s for _, s in shares)


# -- Subcomm ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dims", [None, 1, 2, 3, (0, 0), (0, 1), (1, 0), (0, 0, 1), [-1, 0, 1]])
def test_subcomm_forms(world, dims):
    p = world.size
    request = [0] if dims is None else [0] * dims if isinstance(dims, int) else list(dims)
    want = MPI.Compute_dims(p, [max(0, d) for d in request])
    sub = Subcomm(world, dims)
    cart = sub.comm
    ok = isinstance(sub, tuple) and [c.Get_size() for c in sub] == want
    ok &= sub.dims == tuple(want)
    ok &= cart is not None and cart.Get_topology() == MPI.CART and cart.Get_size() == p
    coords = cart.Get_coords(cart.Get_rank())
    ok &= [c.Get_rank() for c in sub] == list(coords)
    sub.destroy()
    ok &= sub.comm is None and all(c == MPI.COMM_NULL for c in sub)
    all_ranks_agree(world, ok, f"Subcomm(world, {dims}) at P={p}: want {want}")


def test_subcomm_of_a_cartesian_comm(world):
    p = world.size
    cart = world.Create_cart(MPI.Compute_dims(p, 2), reorder=False)
    sub = Subcomm(cart)
    ok = sub.comm is cart and [c.Get_size() for c in sub] == list(cart.Get_topo()[0])
    sub.destroy()
    ok &= cart != MPI.COMM_NULL and cart.Get_size() == p  # the caller's: not freed
    expect_everywhere(world, lambda: Subcomm(cart, [0, 0]), ValueError, "None")
    cart.Free()
    all_ranks_agree(world, ok, "Subcomm(cart)")


def test_bad_subcomm_arguments(world):
    p = world.size
    expect_everywhere(world, lambda: Subcomm(world, 0), ValueError, "positive")
    expect_everywhere(world, lambda: Subcomm(world, []), ValueError, "empty")
    expect_everywhere(world, lambda: Subcomm(world, (p + 1, 1)), ValueError, "does not fit")
    expect_everywhere(world, lambda: Subcomm("world", 2), TypeError, "intracommunicator")


# -- Pencil -------------------------------------------------------------------------------------

SHAPES = [(7, 8), (8, 7, 9), (5, 4, 3, 6), (2, 9)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_pencil_layouts(world, shape):
    ndim = len(shape)
    bad = []
    for pdim in [None, *range(1, ndim)]:
        sub = Subcomm(world, pdim if pdim is None else [0] * pdim + [1] * (ndim - pdim))
        for axis in range(-ndim, ndim):
            if len(sub) == ndim and sub[axis].Get_size() != 1:
                continue
            p0 = Pencil(sub, shape, axis)
            pencils = [p0] + [p0.pencil(a) for a in range(ndim)]
            for p in pencils:
                subshape, substart = expected_layout(p)
                if (p.subshape, p.substart) != (subshape, substart):
                    bad.append(f"{pdim} axis {p.axis}: {p.subshape} {p.substart}")
                if p.subcomm[p.axis].Get_size() != 1 or p.shape != shape or p.comm is not sub.comm:
                    bad.append(f"{pdim} axis {p.axis}: attributes")
                if p.local_slice() != tuple(slice(s, s + n) for s, n in zip(substart, subshape)):
                    bad.append(f"{pdim} axis {p.axis}: local_slice")
                if not tiles(world, shape, p.local_slice()):
                    bad.append(f"{pdim} axis {p.axis}: blocks do not tile the array")
            if p0.axis != axis % ndim:
                bad.append(f"axis {axis} became {p0.axis}")
        sub.destroy()
    all_ranks_agree(world, not bad, str(bad))


def test_pencil_pads_a_short_subcomm(world):
    """mpi4py-fft: fewer communicators than axes are padded with COMM_SELF, one at `axis`."""
    p = world.size
    sub = Subcomm(world, None)  # one communicator of size P
    ok = True
    for axis, where in ((0, 1), (1, 0), (2, 0), (-1, 0)):
        pen = Pencil(sub, (6, 5, 4), axis)
        sizes = [c.Get_size() for c in pen.subcomm]
        want = [1, 1, 1]
        want[where] = p
        ok &= sizes == want and pen.subcomm[axis] == MPI.COMM_SELF
        ok &= pen.subshape == expected_layout(pen)[0]
    two = Subcomm(world, (0, 1))
    pen = Pencil(two, (6, 5, 4, 3), 1)  # [c0, c1] -> [c0, SELF, c1, SELF]
    ok &= [c.Get_size() for c in pen.subcomm] == [two[0].Get_size(), 1, 1, 1]
    ok &= pen.subcomm[2] == two[1]
    all_ranks_agree(world, ok, "padded subcomm")
    two.destroy()
    sub.destroy()


def test_pencil_shorter_than_its_processes(world):
    """An axis shorter than the ranks along it: the ranks past its length hold empty blocks,
    and too_small() names the first such axis (empty where every rank holds data)."""
    p = world.size
    sub = Subcomm(world, None)  # axis 0 over all P ranks
    short = Pencil(sub, (2, 5, 3), 2)
    ok = short.subshape == expected_layout(short)[0]
    if p > 2:
        ok &= short.subshape[0] == (1 if world.rank < 2 else 0)
    want = f"axis 0 has 2 elements but is distributed over {p} processes" if p > 2 else ""
    ok &= short.too_small().startswith(want) and bool(short.too_small()) == (p > 2)
    ok &= Pencil(sub, (p, 5, 3), 2).too_small() == ""
    other = short.pencil(0)  # axis 2, of 3 elements, now over the P ranks
    want = f"axis 2 has 3 elements but is distributed over {p} processes" if p > 3 else ""
    ok &= other.too_small().startswith(want) and bool(other.too_small()) == (p > 3)
    ok &= other.subshape == expected_layout(other)[0]
    all_ranks_agree(world, ok, "too_small")
    sub.destroy()


def test_pencil_allocation_comm(world):
    sub = Subcomm(world, (0, 1))
    ok = Pencil(sub, (4, 5)).comm is sub.comm
    ok &= Pencil(tuple(sub), (4, 5)).comm is None  # a plain tuple knows no grid
    ok &= Pencil(tuple(sub), (4, 5), 1, world).comm is world
    ok &= Pencil(sub, (4, 5), comm=world).pencil(0).comm is world
    all_ranks_agree(world, ok, "Pencil.comm")
    sub.destroy()


def test_bad_pencil_arguments(world):
    sub = Subcomm(world, (0, 1))
    for args, fragment in [
        ((sub, (8,)), "two axes"),
        ((sub, (8, 0)), "empty"),
        ((sub, (8, 8), 2), "range"),
        ((list(sub) * 2, (8, 8)), "communicators"),
        (([], (8, 8)), "communicators"),
    ]:
        expect_everywhere(world, lambda args=args: Pencil(*args), ValueError, fragment)
    if world.size > 1:
        expect_everywhere(world, lambda: Pencil(sub, (8, 8), 0), ValueError, "aligned")
    p0 = Pencil(sub, (8, 8))
    expect_everywhere(world, lambda: p0.transfer(p0, float), ValueError, "aligned")
    other = Pencil(sub, (8, 9)).pencil(0)
    expect_everywhere(world, lambda: p0.transfer(other, float), ValueError, "shapes")
    sub.destroy()


# -- Transfer -----------------------------------------------------------------------------------


def check_chain(world, sub, shape, axes, typecode, arena: bool) -> list[str]:
    """mpi4py-fft's test_pencil: A -> B -> C and back, here against the global array."""
    axis1, axis2, axis3 = axes
    p0 = Pencil(sub, shape)
    pa = p0.pencil(axis1)
    pb = pa.pencil(axis2)
    pc = pb.pencil(axis3)
    t1 = Pencil.transfer(pa, pb, typecode)
    t2 = Pencil.transfer(pb, pc, typecode)
    g = global_array(shape, typecode, sum(shape) + 7 * axis1 + axis2)

    def new(p):
        if arena:
            return zcoll.zeros(sub.comm, p.subshape, typecode)
        return np.zeros(p.subshape, typecode)

    a, b, c = new(pa), new(pb), new(pc)
    a[...] = g[pa.local_slice()]
    bad = []
    what = f"{shape} {axes} {typecode} arena={arena}"
    t1.forward(a, b)
    if not np.array_equal(b, g[pb.local_slice()]):
        bad.append(f"{what}: forward 1")
    t2.forward(b, c)
    if not np.array_equal(c, g[pc.local_slice()]):
        bad.append(f"{what}: forward 2")
    b.fill(0)
    t2.backward(c, b)
    a.fill(0)
    t1.backward(b, a)
    if not np.array_equal(a, g[pa.local_slice()]):
        bad.append(f"{what}: backward")
    t1.destroy()
    t2.destroy()
    return bad


@pytest.mark.parametrize("dim", [2, 3])
def test_transfer_chains(world, dim):
    """mpi4py-fft's test_pencil (a sample of its shapes; all its axis triples and types)."""
    bad = []
    shapes = [(7, 8), (9, 7), (8, 8)] if dim == 2 else [(7, 8, 9), (9, 8, 7)]
    for pdim in [None, *range(1, dim - 1)]:
        sub = Subcomm(world, pdim)
        for shape in shapes:
            for axis1, axis2, axis3 in product(range(dim), repeat=3):
                if axis1 == axis2 or axis2 == axis3:
                    continue
                for typecode in "fdFD":
                    arena = typecode == "d"
                    bad += check_chain(world, sub, shape, (axis1, axis2, axis3 - dim), typecode,
                                       arena)  # fmt: skip
        sub.destroy()
    all_ranks_agree(world, not bad, str(bad[:5]))


@pytest.mark.parametrize("dtype", [np.bool_, np.int16, np.float32, np.complex128])
def test_transfer_attributes_and_slices(world, dtype):
    """mpi4py-fft's positional signature and attributes; results against global slices."""
    p, r = world.size, world.rank
    bad = []
    for shape, axis_a, axis_b in [((10, 7, 6), 2, 0), ((5, 3, 4, 6), 3, 1), ((3, 11), 0, 1)]:
        sub_a, sub_b = list(shape), list(shape)
        sub_a[axis_b] = block(shape[axis_b], p, r)[0]
        sub_b[axis_a] = block(shape[axis_a], p, r)[0]
        t = Transfer(world, shape, dtype, sub_a, axis_a, sub_b, axis_b)
        got = (t.comm, t.shape, t.dtype, t.subshapeA, t.axisA, t.subshapeB, t.axisB)
        if got != (world, shape, np.dtype(dtype), tuple(sub_a), axis_a, tuple(sub_b), axis_b):
            bad.append(f"{shape}: attributes {got}")
        if (t.axis_a, t.axis_b, t.subshape_a, t.subshape_b) != (axis_a, axis_b, *got[3::2]):
            bad.append(f"{shape}: zcoll's names")
        g = global_array(shape, dtype, len(shape))
        cut_a, cut_b = [slice(None)] * len(shape), [slice(None)] * len(shape)
        n, s = block(shape[axis_b], p, r)
        cut_a[axis_b] = slice(s, s + n)
        n, s = block(shape[axis_a], p, r)
        cut_b[axis_a] = slice(s, s + n)
        a = np.ascontiguousarray(g[tuple(cut_a)])
        b = np.zeros(sub_b, dtype)
        if t.forward(a, b) is not b or not np.array_equal(b, g[tuple(cut_b)]):
            bad.append(f"{shape}: forward")
        a2 = np.zeros_like(a)
        if t.backward(b, a2) is not a2 or not np.array_equal(a2, a):
            bad.append(f"{shape}: backward")
        t.destroy()
    all_ranks_agree(world, not bad, str(bad))


@pytest.mark.parametrize("lead", [(3,), (2, 2), (1,)], ids=str)
@pytest.mark.parametrize("arena", [True, False])
def test_fused_components(world, monkeypatch, lead, arena):
    """forward(a, b) with leading component axes: one exchange, each component as a transfer
    of that component alone gives, and as the global array's slices say."""
    sub = Subcomm(world, (0, 0, 1))
    pa = Pencil(sub, (9, 7, 8), 2)
    pb = pa.pencil(0)
    t = pa.transfer(pb, np.complex128)
    g = global_array((*lead, 9, 7, 8), np.complex128, 11)
    whole = (slice(None),) * len(lead)
    make = (lambda s: zcoll.zeros(sub.comm, s, np.complex128)) if arena else (
        lambda s: np.zeros(s, np.complex128))  # fmt: skip
    a, b = make((*lead, *pa.subshape)), make((*lead, *pb.subshape))
    a[...] = g[whole + pa.local_slice()]
    runs = count_plan_runs(monkeypatch)
    t.forward(a, b)
    ok = runs[0] == 1
    ok &= np.array_equal(b, g[whole + pb.local_slice()])
    for k in np.ndindex(*lead):  # one component at a time
        bk = np.zeros(pb.subshape, np.complex128)
        t.forward(np.ascontiguousarray(a[k]), bk)
        ok &= np.array_equal(bk, b[k])
    runs[0] = 0
    back = make(a.shape)
    t.backward(b, back)
    ok &= runs[0] == 1 and np.array_equal(back, a)
    plain = Transfer(t.comm, t.shape, t.dtype, t.subshapeA, t.axisA, t.subshapeB, t.axisB,
                     staging=False)  # fmt: skip
    if arena:  # no work arrays: one plain transfer of the whole field
        b2 = make(b.shape)
        plain.forward(a, b2)
        ok &= np.array_equal(b2, b)
    all_ranks_agree(world, ok, f"fused {lead} arena={arena}")
    sub.destroy()


def test_fused_leading_shapes_differ(world):
    if world.size == 1:
        pytest.skip("needs two ranks")
    sub = Subcomm(world, (0, 1))
    pa = Pencil(sub, (8, 6), 1)
    pb = pa.pencil(0)
    t = pa.transfer(pb, float)
    g = global_array((3, 8, 6), float, 3)
    first = world.rank == 0

    def lead_arrays(n):
        a = np.ascontiguousarray(g[(slice(0, n), *pa.local_slice())])
        return a, np.zeros((n, *pb.subshape))

    a2, b2 = lead_arrays(2)
    a3, b3 = lead_arrays(3)
    scalar_a = np.ascontiguousarray(g[(0, *pa.local_slice())])
    scalar_b = np.zeros(pb.subshape)
    expect_everywhere(world, lambda: t.forward(*(a2, b2) if first else (a3, b3)), ValueError)
    expect_everywhere(world, lambda: t.forward(*(a2, b2) if first else (scalar_a, scalar_b)),
                      ValueError)  # fmt: skip
    expect_everywhere(world, lambda: t.forward(a3, b2), ValueError)
    t.forward(a3, b3)  # still usable, every leading shape
    t.forward(scalar_a, scalar_b)
    ok = np.array_equal(b3, g[(slice(None), *pb.local_slice())])
    ok &= np.array_equal(scalar_b, g[(0, *pb.local_slice())])
    all_ranks_agree(world, ok, "transfers after mismatched leading shapes")
    sub.destroy()


def test_bad_transfer_arguments(world):
    p, r = world.size, world.rank
    shape = (10, 7, 6)
    sub_a = (10, 7, block(6, p, r)[0])
    sub_b = (block(10, p, r)[0], 7, 6)
    expect_everywhere(world, lambda: Transfer(world, shape, float, sub_a, 0, sub_b, 0),
                      ValueError, "differ")  # fmt: skip
    expect_everywhere(world, lambda: Transfer(world, shape, float, sub_a, 0, sub_b, 5),
                      ValueError, "range")  # fmt: skip
    wrong = (sub_b[0] + 1, 7, 6) if r == p - 1 else sub_b
    expect_everywhere(world, lambda: Transfer(world, shape, float, sub_a, 0, wrong, 2),
                      ValueError, "subshapeB")  # fmt: skip
    t = Transfer(world, shape, float, sub_a, 0, sub_b, 2)
    a = np.ones(sub_a)
    floats = zcoll.zeros(world, sub_b, np.float32)
    mine = floats if r == 0 else np.zeros(sub_b)
    expect_everywhere(world, lambda: t.forward(a, mine), TypeError)
    b = np.zeros(sub_b)
    t.forward(a, b)
    ok = bool((b == 1).all())
    t.destroy()
    expect_everywhere(world, lambda: t.forward(a, b), ValueError, "free")
    all_ranks_agree(world, ok, "Transfer after errors")


def test_pencil_transfer_is_kept_until_destroyed(world):
    sub = Subcomm(world, (0, 1))
    pa = Pencil(sub, (6, 5), 1)
    pb = pa.pencil(0)
    t = pa.transfer(pb, float)
    ok = pa.transfer(pb, float) is t
    t.destroy()
    t2 = pa.transfer(pb, float)
    ok &= t2 is not t
    a = np.ones(pa.subshape)
    b = np.zeros(pb.subshape)
    t2.forward(a, b)
    ok &= bool((b == 1).all())
    all_ranks_agree(world, ok, "Pencil.transfer cache")
    sub.destroy()


@pytest.mark.parametrize("path", PRIVATE_PATHS)
@pytest.mark.parametrize("kind", ["plain", "heap", "mixed"])
def test_transfer_of_plain_and_heap_arrays(world, path, kind):
    """Transfer.forward/backward on plain NumPy arrays (pulled by CMA or staged through the
    work arrays), on shared-heap arrays (bound in place) and on a mix across ranks (arena,
    plain, heap, strided views), against the global array's slices."""
    p, r = world.size, world.rank
    bad = []
    with private_buffers_by(world, path):
        for shape, axis_a, axis_b, lead in [((10, 7, 6), 2, 0, ()), ((9, 8, 5), 0, 1, (2,))]:
            sub_a, sub_b = list(shape), list(shape)
            sub_a[axis_b] = block(shape[axis_b], p, r)[0]
            sub_b[axis_a] = block(shape[axis_a], p, r)[0]
            t = Transfer(world, shape, np.complex128, sub_a, axis_a, sub_b, axis_b)
            g = global_array((*lead, *shape), np.complex128, 5)
            cut_a, cut_b = [slice(None)] * g.ndim, [slice(None)] * g.ndim
            n, s = block(shape[axis_b], p, r)
            cut_a[len(lead) + axis_b] = slice(s, s + n)
            n, s = block(shape[axis_a], p, r)
            cut_b[len(lead) + axis_a] = slice(s, s + n)
            want_a, want_b = g[tuple(cut_a)], g[tuple(cut_b)]
            mine = kind if kind != "mixed" else ("arena", "plain", "heap", "view")[r % 4]
            arena_a = zcoll.zeros(world, want_a.shape, np.complex128)  # collective
            arena_b = zcoll.zeros(world, want_b.shape, np.complex128)
            if mine == "arena":
                a, b = arena_a, arena_b
            elif mine == "heap":
                with zcoll.use_shared_heap():
                    a = np.zeros(want_a.shape, np.complex128)
                    b = np.zeros(want_b.shape, np.complex128)
            elif mine == "view":  # not C-contiguous: staged whatever the path
                a = np.zeros((*want_a.shape[:-1], 2 * want_a.shape[-1]), np.complex128)[..., ::2]
                b = np.zeros((*want_b.shape[:-1], 2 * want_b.shape[-1]), np.complex128)[..., ::2]
            else:
                a, b = np.zeros(want_a.shape, np.complex128), np.zeros(want_b.shape, np.complex128)
            a[...] = want_a
            if t.forward(a, b) is not b or not np.array_equal(b, want_b):
                bad.append(f"{shape} {mine}: forward")
            plan = t._staged[lead].plans[0]  # made by the first forward
            assert plan is not None
            a[...] = 0
            if t.backward(b, a) is not a or not np.array_equal(a, want_a):
                bad.append(f"{shape} {mine}: backward")
            # The heap is published to peers when the node's ranks can read each other.
            published = zcoll._context.context(world).core.cma[0] == "works"
            shared_heap = mine == "heap" and zcoll.in_heap(a) and published
            direct = mine == "arena" or (mine != "view" and path == "cma" and plan.pulls)
            if (
                a.flags.c_contiguous
                and a.shape == tuple(sub_a)
                and plan.accepts(a) != (direct or shared_heap or mine == "arena")
            ):
                bad.append(f"{shape} {mine}: accepts {plan.accepts(a)}")
            if plan.pulls != (path == "cma" and world.size > 1 and cma_works(world)):
                bad.append(f"{shape}: pulls {plan.pulls}")
            t.destroy()
    all_ranks_agree(world, not bad, f"{path} {kind}: {bad}")


def cma_works(comm) -> bool:
    ctx = zcoll._context.context(comm)
    return ctx.core.cma[0] == "works" and ctx.node_size > 1
