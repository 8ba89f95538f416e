"""allreduce, reduce, reduce_scatter_block, bcast and barrier against mpi4py and closed forms.

Integers (and bool) are compared bit for bit with ``comm.Allreduce`` (bool, which MPI does not
combine with every op, with NumPy's ufuncs over the allgathered inputs); floats within a bound
that follows from the combination order (any order of P additions errs by at most
(P - 1) * eps * sum|x|), and bit-identical on every rank and from call to call. Where the
combination order is documented (one node, "flat" and "tiled": rank order), float16 and
float32 must equal NumPy's left fold in rank order bit for bit.
"""

from __future__ import annotations

import hashlib
import time

import numpy as np
import pytest
from mpi4py import MPI

import zcoll
from helpers import PRIVATE_PATHS, all_ranks_agree, private_buffers_by
from helpers.errors import expect_everywhere, last
from helpers.jobs import check_job_with_killed_rank, killing_job
from zcoll import _reductions

ALGORITHMS = ["auto", *zcoll.REDUCE_ALGORITHMS]
OPS = list(zcoll.REDUCE_OPS)
MPI_OPS = dict(zip(OPS, (MPI.SUM, MPI.PROD, MPI.MIN, MPI.MAX, MPI.LAND, MPI.LOR, MPI.LXOR,
                         MPI.BAND, MPI.BOR, MPI.BXOR)))  # fmt: skip
INTS = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]
FLOATS = [np.float16, np.float32, np.float64]
COMPLEX = [np.complex64, np.complex128]
# NumPy's ufunc for each op (the independent reference for bool and for fold orders).
UFUNCS = {
    "sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
    "land": np.logical_and, "lor": np.logical_or, "lxor": np.logical_xor,
    "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor,
}  # fmt: skip
SIZES = [0, 1, 3, 17, 1000, 40_003]  # elements; 40_003 is prime: tiles of unequal size


def defined(op: str, dtype) -> bool:
    kind = np.dtype(dtype).kind
    if kind == "c":
        return op in ("sum", "prod")
    if kind == "f":
        return op not in ("band", "bor", "bxor")
    return True


def single_node(comm) -> bool:
    return not zcoll._context.context(comm).multi_node


def seeded(comm, tag: int, n: int, dtype, *, small: bool = False) -> np.ndarray:
    """This rank's input: seeded by (tag, rank); small values for products."""
    rng = np.random.default_rng(tag * 7919 + comm.rank * 104729 + n)
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, n).astype(bool)
    if dt.kind in "iu":
        lo, hi = (0, 3) if small else (np.iinfo(dt).min // 2, np.iinfo(dt).max // 2)
        if dt.kind == "i" and small:
            lo = -2
        return rng.integers(lo, hi, n, dtype=np.int64 if dt.kind == "i" else np.uint64).astype(dt)
    scale = 1.5 if small else 100.0
    x = rng.uniform(-scale, scale, n)
    if dt.kind == "c":
        x = x + 1j * rng.uniform(-scale, scale, n)
    if small and dt.kind == "f":  # exact zeros too, for the logical ops
        x[rng.integers(0, 4, n) == 0] = 0
    return x.astype(dt)


def identical_everywhere(comm, a: np.ndarray) -> bool:
    """Whether every rank holds the same bits in `a`."""
    digest = hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()
    return len(set(comm.allgather(digest))) == 1


def numpy_fold(comm, x: np.ndarray, op: str) -> np.ndarray:
    """NumPy's left fold, in rank order, over every rank's `x` (allgathered)."""
    everyone = comm.allgather(x)
    out = everyone[0].copy()
    for y in everyone[1:]:
        out = UFUNCS[op](out, y).astype(x.dtype)
    return out


def mpi_allreduce(comm, x: np.ndarray, op: str, as_dtype=None) -> np.ndarray:
    data = x if as_dtype is None else x.astype(as_dtype)
    out = np.empty_like(data)
    comm.Allreduce(data, out, op=MPI_OPS[op])
    return out


def float_tolerance(comm, x: np.ndarray) -> float:
    """Bound on |any-order sum - exact sum| for P addends of |x|, in x's precision."""
    eps = np.finfo(x.dtype).eps
    bound = mpi_allreduce(comm, np.abs(x).astype(np.float64), "sum")
    return float((comm.size + 1) * eps * bound.max()) if x.size else 0.0


def check_against_mpi(comm, x: np.ndarray, got: np.ndarray, op: str) -> str:
    """'' when `got` is the right allreduce of every rank's `x`, else what is wrong."""
    dt = x.dtype
    if got.shape != x.shape or got.dtype != dt:
        return f"shape/dtype {got.shape} {got.dtype}"
    if dt.kind == "b":
        want = numpy_fold(comm, x, op)
        return "" if np.array_equal(got, want) else "bool differs from NumPy's fold"
    if dt.kind in "iu":
        # Sums and products in 64 bits, wrapped to the dtype after (NumPy's semantics):
        # Open MPI 4.1's vectorised 8- and 16-bit sums saturate instead of wrapping.
        wide = (np.int64 if dt.kind == "i" else np.uint64) if op in ("sum", "prod") else None
        want = mpi_allreduce(comm, x, op, wide).astype(dt)
        return "" if got.tobytes() == want.tobytes() else "differs from comm.Allreduce"
    if op in ("land", "lor", "lxor"):  # MPI has no logical ops on floats; exact in any order
        want = numpy_fold(comm, x, op)
        return "" if got.tobytes() == want.tobytes() else "differs from NumPy's fold"
    wide = np.complex128 if dt.kind == "c" else np.float64
    want = mpi_allreduce(comm, x, op, wide)
    if op in ("min", "max"):  # exact in any order
        ok = np.array_equal(got.astype(wide), want.astype(dt).astype(wide), equal_nan=True)
        return "" if ok else "differs from comm.Allreduce"
    if op == "prod":  # |x| <= 1.5 with zeros: relative bound per factor
        tol = 4 * comm.size * np.finfo(dt).eps * np.abs(want).max() if x.size else 0
        tol = max(tol, float(np.finfo(dt).tiny))
    else:
        tol = float_tolerance(comm, x) + (np.finfo(dt).eps * np.abs(want).max() if x.size else 0)
    err = float(np.abs(got.astype(wide) - want).max()) if x.size else 0.0
    return "" if err <= tol else f"error {err:.3g} > tolerance {tol:.3g}"


# --------------------------------------------------------------------------------------------
# Every op on every dtype (one size), every algorithm
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_op_and_dtype_matches_mpi(world, algorithm):
    n = 37
    failures = []
    for tag, dtype in enumerate([np.bool_, *INTS, *FLOATS, *COMPLEX]):
        for op in OPS:
            if not defined(op, dtype):
                continue
            x = seeded(world, tag, n, dtype, small=op == "prod" or op.startswith("l"))
            got = zcoll.allreduce(world, x, op=op, algorithm=algorithm)
            why = check_against_mpi(world, x, got, op)
            if not identical_everywhere(world, got):
                why += " not identical on every rank"
            if why:
                failures.append((np.dtype(dtype).name, op, why))
    all_ranks_agree(world, not failures, f"algorithm={algorithm}: {failures}")


@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
def test_undefined_ops_raise_type_error(world, op):
    """Bitwise ops on floats and orderings on complex numbers are TypeErrors (as in NumPy),
    on every rank."""
    x = np.ones(4, np.complex128)
    if op in ("min", "max"):
        expect_everywhere(world, lambda: zcoll.allreduce(world, x, op=op), TypeError,
                          fragment=f"op '{op}' is not defined for dtype complex128")  # fmt: skip
    y = np.ones(4, np.float32)
    bitwise = {"sum": "band", "prod": "bor", "min": "bxor", "max": "bxor"}[op]
    expect_everywhere(world, lambda: zcoll.allreduce(world, y, op=bitwise), TypeError,
                      fragment="not defined for dtype float32")  # fmt: skip


def test_mpi_op_objects_mean_the_same(world):
    x = seeded(world, 3, 50, np.int32)
    for name, mpi_op in MPI_OPS.items():
        a = zcoll.allreduce(world, x, op=mpi_op)
        b = zcoll.allreduce(world, x, op=name)
        all_ranks_agree(world, np.array_equal(a, b), f"MPI op for {name}")


# --------------------------------------------------------------------------------------------
# Sizes, algorithms, communicator kinds, arena/private, in place
# --------------------------------------------------------------------------------------------


def make(comm, x: np.ndarray, arena: bool) -> np.ndarray:
    if not arena:
        return x.copy()
    a = zcoll.empty(comm, x.shape, x.dtype)
    a[...] = x
    return a


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_allreduce_sizes_and_buffers(comm, algorithm):
    failures = []
    for tag, n in enumerate(SIZES):
        for dtype in (np.int64, np.float64):
            x = seeded(comm, tag, n, dtype)
            for mode in ("private", "arena", "in_place_private", "in_place_arena"):
                arena = mode.endswith("arena")
                src = make(comm, x, arena)
                if mode.startswith("in_place"):
                    got = zcoll.allreduce(comm, zcoll.IN_PLACE, src, algorithm=algorithm)
                    ok_obj = got is src
                else:
                    recv = make(comm, np.zeros_like(x), arena)
                    got = zcoll.allreduce(comm, src, recv, algorithm=algorithm)
                    ok_obj = got is recv and np.array_equal(src, x)  # input untouched
                why = check_against_mpi(comm, x, got, "sum")
                again = zcoll.allreduce(comm, x, algorithm=algorithm)
                if not ok_obj:
                    why += " wrong object or input changed"
                if not identical_everywhere(comm, got):
                    why += " not identical on every rank"
                if again.tobytes() != got.tobytes():
                    why += " not deterministic"
                if why:
                    failures.append((n, np.dtype(dtype).name, mode, why))
    all_ranks_agree(comm, not failures, f"algorithm={algorithm}: {failures}")


def test_any_shape_and_default_result(world):
    x = seeded(world, 1, 60, np.float32).reshape(3, 4, 5)
    got = zcoll.allreduce(world, x, op="max")
    ok = got.shape == (3, 4, 5) and not zcoll.is_shared(got)
    ok &= check_against_mpi(world, x, got, "max") == ""
    z = zcoll.allreduce(world, np.zeros((0, 3), np.int16))
    ok &= z.shape == (0, 3)
    s = zcoll.allreduce(world, np.float64(world.rank))  # 0-d
    ok &= s.shape == () and float(s) == world.size * (world.size - 1) / 2
    all_ranks_agree(world, ok, "shapes")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_closed_forms(comm, algorithm):
    p, r = comm.size, comm.rank
    n = 1001
    ok = True
    ok &= bool(
        (zcoll.allreduce(comm, np.full(n, r), algorithm=algorithm) == p * (p - 1) // 2).all()
    )
    ok &= bool((zcoll.allreduce(comm, np.full(n, r), op="max", algorithm=algorithm) == p - 1).all())
    ok &= bool((zcoll.allreduce(comm, np.full(n, r), op="min", algorithm=algorithm) == 0).all())
    ok &= bool(
        (zcoll.allreduce(comm, np.full(n, 2.0), op="prod", algorithm=algorithm) == 2.0**p).all()
    )
    ranks = zcoll.allreduce(comm, np.arange(n, dtype=np.float64) + r, algorithm=algorithm)
    ok &= bool((ranks == p * np.arange(n) + p * (p - 1) / 2).all())  # exact: integers < 2^53
    bits = zcoll.allreduce(comm, np.array([1 << (r % 63)], np.uint64), op="bor")
    ok &= int(bits[0]) == sum(1 << k for k in {q % 63 for q in range(p)})
    all_ranks_agree(comm, ok, f"closed forms, algorithm={algorithm}")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_nan_and_inf_propagate(world, algorithm):
    p, r = world.size, world.rank
    x = np.arange(10, dtype=np.float64)
    if r == p - 1:
        x[3], x[5] = np.nan, np.inf
    if r == 0:
        x[7] = -np.inf
        if p > 1:
            x[5] = -np.inf  # inf + -inf
    total = zcoll.allreduce(world, x, algorithm=algorithm)
    low = zcoll.allreduce(world, x, op="min", algorithm=algorithm)
    high = zcoll.allreduce(world, x, op="max", algorithm=algorithm)
    prod = zcoll.allreduce(world, x, op="prod", algorithm=algorithm)
    ok = all(np.isnan(a[3]) for a in (total, low, high, prod))
    ok &= bool(np.isnan(total[5])) if p > 1 else total[5] == np.inf
    ok &= low[7] == -np.inf and total[7] == -np.inf
    ok &= high[7] == (7 if p > 1 else -np.inf)
    if p > 1:
        ok &= low[5] == -np.inf and high[5] == np.inf
    ok &= all(identical_everywhere(world, a) for a in (total, low, high, prod))
    all_ranks_agree(world, bool(ok), f"NaN/inf, algorithm={algorithm}")


@pytest.mark.parametrize("algorithm", ["flat", "tiled"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_rank_order_fold_is_numpys(world, algorithm, dtype):
    """On one node, "flat" and "tiled" combine in rank order: the result is NumPy's left fold
    in rank order, bit for bit (float16 rounded to float16 after every step, as NumPy)."""
    if not single_node(world):
        pytest.skip("across nodes the nodes' results are combined after each node's")
    for n in (5, 3001):
        x = seeded(world, 11, n, dtype)
        for op in ("sum", "prod"):
            y = x if op == "sum" else (x / 50).astype(dtype)
            got = zcoll.allreduce(world, y, op=op, algorithm=algorithm)
            want = numpy_fold(world, y, op)
            all_ranks_agree(world, got.tobytes() == want.tobytes(), f"{op} n={n}")


def test_auto_choice_is_the_same_everywhere(world):
    """The same on every rank of a node size (each node reduces on its own first: nodes of
    other sizes, such as uneven virtual nodes, may choose otherwise)."""
    ctx = zcoll._context.context(world)
    choices = [ctx.core.reduction_choice(n) for n in (8, 1024, 65536, 1 << 22)]
    by_size: dict[int, set] = {}
    for size, chosen in world.allgather((ctx.node_size, tuple(choices))):
        by_size.setdefault(size, set()).add(chosen)
    all_ranks_agree(world, all(len(c) == 1 for c in by_size.values()), str(by_size))
    all_ranks_agree(world, all(c in zcoll.REDUCE_ALGORITHMS for c in choices), str(choices))


# --------------------------------------------------------------------------------------------
# reduce, reduce_scatter_block, bcast, barrier
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_reduce_every_root(comm, algorithm):
    failures = []
    for n in (0, 7, 5000):
        x = seeded(comm, n, n, np.int32)
        for root in range(comm.size):
            want = np.empty_like(x) if comm.rank == root else None
            comm.Reduce(x, want, op=MPI.SUM, root=root)
            got = zcoll.reduce(comm, x, root=root, algorithm=algorithm)
            if comm.rank == root:
                ok = got is not None and np.array_equal(got, want)
                buf = x.copy()  # in place at the root
                ok &= zcoll.reduce(comm, zcoll.IN_PLACE, buf, root=root) is buf
                ok &= np.array_equal(buf, want)
            else:
                ok = got is None
                ok &= zcoll.reduce(comm, x, root=root) is None
            if not ok:
                failures.append((n, root))
    all_ranks_agree(comm, not failures, f"reduce algorithm={algorithm}: {failures}")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_reduce_scatter_block_matches_mpi(comm, algorithm):
    p = comm.size
    failures = []
    for block in (0, 1, 5, 3001):
        for dtype in (np.int64, np.float64):
            x = seeded(comm, block, p * block, dtype)
            want = np.empty(block, dtype)
            comm.Reduce_scatter_block(x, want, op=MPI.SUM)
            got = zcoll.reduce_scatter_block(comm, x.reshape(p, block), algorithm=algorithm)
            full = zcoll.allreduce(comm, x, algorithm=algorithm)
            buf = x.copy()
            zcoll.reduce_scatter_block(comm, zcoll.IN_PLACE, buf, algorithm=algorithm)
            ok = got.shape == (block,)
            if np.dtype(dtype).kind == "i":
                ok &= np.array_equal(got, want) and np.array_equal(buf[:block], want)
            else:  # the block of this algorithm's allreduce, and close to MPI's
                mine = full[comm.rank * block : (comm.rank + 1) * block]
                ok &= check_against_mpi(comm, x, full, "sum") == ""
                ok &= np.allclose(got, want, rtol=1e-12, atol=1e-9)
                ok &= np.allclose(buf[:block], mine, rtol=1e-12, atol=1e-9)
            if not ok:
                failures.append((block, np.dtype(dtype).name))
    all_ranks_agree(comm, not failures, f"reduce_scatter_block {algorithm}: {failures}")


def test_reduce_scatter_block_needs_divisible_sizes(world):
    if world.size == 1:
        pytest.skip("every size is divisible by 1")
    x = np.zeros(world.size + 1)
    expect_everywhere(world, lambda: zcoll.reduce_scatter_block(world, x), ValueError,
                      fragment="not divisible")  # fmt: skip


@pytest.mark.parametrize("arena", [False, True], ids=["private", "arena"])
def test_bcast_matches_mpi(comm, arena):
    failures = []
    for n in (0, 3, 700, 300_001):
        for root in sorted({0, comm.size - 1, comm.size // 2}):
            for dtype in (np.uint8, np.float64, np.complex128):
                data = seeded(comm, 5, n, dtype)
                want = data.copy()
                comm.Bcast(want, root=root)
                buf = make(comm, data, arena)
                got = zcoll.bcast(comm, buf, root=root)
                if got is not buf or buf.tobytes() != want.tobytes():
                    failures.append((n, root, np.dtype(dtype).name))
    all_ranks_agree(comm, not failures, f"bcast: {failures}")


def test_bcast_read_only_root_buffer(world):
    buf = np.arange(10.0) if world.rank == 0 else np.zeros(10)
    buf.flags.writeable = world.rank != 0
    zcoll.bcast(world, buf)
    all_ranks_agree(world, np.array_equal(buf, np.arange(10.0)), "bcast from read-only root")


def test_barrier_orders_writes(world):
    """Every rank writes its arena array before the barrier; everyone sees every write after."""
    a = zcoll.zeros(world, 1, np.int64)
    views = zcoll.peer_arrays(world, a)
    ok = True
    for i in range(1, 30):
        a[0] = i
        zcoll.barrier(world)
        ok &= all(int(v[0]) == i for v in views if v is not None)
        zcoll.barrier(world)
    all_ranks_agree(world, ok, "a write before the barrier was not seen after it")


def test_first_barrier_waits_for_the_last_rank(world):
    """The first zcoll call on a fresh communicator a barrier (its context made in it), on one
    node or across nodes (the round between nodes): no rank leaves before the last rank, which
    comes late, has entered it (one machine: one monotonic clock for every rank)."""
    comm = world.Dup()
    try:
        late = comm.size - 1
        if comm.rank == late:
            time.sleep(0.2)
        entered = time.monotonic()
        zcoll.barrier(comm)
        left = time.monotonic()
        times = comm.allgather((entered, left))
    finally:
        comm.Free()
    last_in = times[late][0]
    all_ranks_agree(world, all(out >= last_in for _, out in times), f"{times}")


def test_several_communicators_at_once(world):
    """Reductions on a split and a dup alternate with reductions on the world."""
    halves = world.Split(world.rank % 2, key=world.rank)
    dup = world.Dup()
    try:
        for i in range(5):
            a = zcoll.allreduce(halves, np.full(100, world.rank + i))
            b = zcoll.allreduce(dup, np.full(100, 1), algorithm="tiled")
            c = zcoll.allreduce(world, np.full(100, 2), op="max", algorithm="tree")
            mine = [q for q in range(world.size) if q % 2 == world.rank % 2]
            ok = bool((a == sum(mine) + len(mine) * i).all())
            ok &= bool((b == world.size).all()) and bool((c == 2).all())
            all_ranks_agree(world, ok, f"iteration {i}")
    finally:
        halves.Free()
        dup.Free()


def test_many_calls_stay_correct(world):
    x = np.ones(33, np.int64)
    ok = True
    for i in range(300):
        alg = ALGORITHMS[i % len(ALGORITHMS)]
        ok &= bool((zcoll.allreduce(world, x * i, algorithm=alg) == world.size * i).all())
    all_ranks_agree(world, ok, "300 calls")


# --------------------------------------------------------------------------------------------
# Bad input on one rank: the same clear error everywhere, the communicator still usable
# --------------------------------------------------------------------------------------------


def test_op_dtype_mismatch_on_one_rank(world):
    x = np.ones(8, np.float64 if last(world) else np.int64)
    expect_everywhere(world, lambda: zcoll.allreduce(world, x, op="bxor"), TypeError,
                      fragment="op 'bxor' is not defined for dtype float64")  # fmt: skip


def test_sizes_differ_between_ranks(world):
    if world.size == 1:
        pytest.skip("needs two ranks to disagree")
    x = np.ones(9 if last(world) else 8)
    for alg in ALGORITHMS:
        expect_everywhere(world, lambda a=alg: zcoll.allreduce(world, x, algorithm=a),
                          ValueError, fragment="sizes differ")  # fmt: skip


def test_dtypes_ops_roots_algorithms_differ(world):
    if world.size == 1:
        pytest.skip("needs two ranks to disagree")
    x = np.ones(8, np.float32 if last(world) else np.int32)
    expect_everywhere(world, lambda: zcoll.allreduce(world, x), TypeError,
                      fragment="dtypes differ")  # fmt: skip
    y = np.ones(8)
    op = "max" if last(world) else "sum"
    expect_everywhere(world, lambda: zcoll.allreduce(world, y, op=op), ValueError,
                      fragment="ops differ")  # fmt: skip
    root = 1 if last(world) else 0
    expect_everywhere(world, lambda: zcoll.reduce(world, y, root=root), ValueError,
                      fragment="roots differ")  # fmt: skip
    expect_everywhere(world, lambda: zcoll.bcast(world, y, root=root), ValueError,
                      fragment="roots differ")  # fmt: skip
    alg = "tree" if last(world) else "tiled"
    expect_everywhere(world, lambda: zcoll.allreduce(world, y, algorithm=alg), ValueError,
                      fragment="algorithms differ")  # fmt: skip


def test_bad_root_on_one_rank(world):
    root = world.size if last(world) else 0
    y = np.ones(4)
    expect_everywhere(world, lambda: zcoll.reduce(world, y, root=root), ValueError,
                      fragment="root must be a rank")  # fmt: skip
    expect_everywhere(world, lambda: zcoll.bcast(world, y, root=-1 if last(world) else 0),
                      ValueError, fragment="root must be a rank")  # fmt: skip


def test_read_only_recvbuf_on_one_rank(world):
    x = np.ones(6)
    recv = np.zeros(6)
    recv.flags.writeable = not last(world)
    expect_everywhere(world, lambda: zcoll.allreduce(world, x, recv), ValueError,
                      fragment="read-only")  # fmt: skip
    buf = np.zeros(6)
    buf.flags.writeable = not last(world) or world.size == 1
    if world.size > 1:
        expect_everywhere(world, lambda: zcoll.bcast(world, buf, root=0), ValueError,
                          fragment="buf is read-only")  # fmt: skip


def test_unknown_algorithm_and_op_on_one_rank(world):
    x = np.ones(6)
    alg = "zigzag" if last(world) else "auto"
    expect_everywhere(world, lambda: zcoll.allreduce(world, x, algorithm=alg), ValueError,
                      fragment="algorithm must be 'auto' or one of")  # fmt: skip
    op = MPI.REPLACE if last(world) else "sum"
    expect_everywhere(world, lambda: zcoll.allreduce(world, x, op=op), ValueError,
                      fragment="op must be one of")  # fmt: skip
    expect_everywhere(world, lambda: zcoll.allreduce(world, x, op="avg" if last(world) else "sum"),
                      ValueError, fragment="'avg'")  # fmt: skip


def test_wrong_result_size_and_unsupported_dtype(world):
    x = np.ones(6)
    recv = np.zeros(7 if last(world) else 6)
    expect_everywhere(world, lambda: zcoll.allreduce(world, x, recv), ValueError,
                      fragment="expected 6 elements")  # fmt: skip
    ld = np.ones(6, np.longdouble if last(world) else np.float64)
    expect_everywhere(world, lambda: zcoll.allreduce(world, ld), TypeError,
                      fragment="do not support dtype")  # fmt: skip
    ip = zcoll.IN_PLACE if last(world) else x
    expect_everywhere(world, lambda: zcoll.allreduce(world, ip), ValueError,
                      fragment="IN_PLACE needs recvbuf")  # fmt: skip


# --------------------------------------------------------------------------------------------
# A peer killed inside a reduction
# --------------------------------------------------------------------------------------------

KILL_JOB = killing_job(
    setup="""
    algorithms = ["flat", "tree", "dissemination", "tiled"]
    small, large = np.ones(4), zcoll.empty(comm, 50_000)
    large[:] = 1
    """,
    step="""
    alg = algorithms[i % 4]
    assert (zcoll.allreduce(comm, small, algorithm=alg) == p).all()
    assert zcoll.allreduce(comm, large, algorithm=alg)[-1] == p
    zcoll.bcast(comm, small, root=i % p)
    zcoll.barrier(comm)
    """,
    iterations=3000,
    kill_at=400,
)


@pytest.mark.skipif(MPI.COMM_WORLD.size > 1, reason="starts its own job: runs when alone")
def test_killed_peer_inside_reductions(tmp_path):
    """One of 3 ranks SIGKILLs itself in a loop of reductions: the survivors raise PeerError
    saying it died (ZCOLL_TIMEOUT is 30 s: death is noticed, not a timeout), the job ends and
    nothing of it is left in /dev/shm."""
    check_job_with_killed_rank(tmp_path, KILL_JOB, 2)


def test_memory_flat_over_many_reductions(world):
    """10^4 reductions of every kind (private results, allocated results, bcast, barrier)
    after a warm-up: RSS grows by less than 1 MiB and the arena's bytes in use are unchanged."""
    import gc
    import os

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    x, r = np.ones(16), np.empty(16)
    ctx = zcoll._context.lookup(world)

    def loop(n: int) -> bool:
        ok = True
        for i in range(n):
            alg = ALGORITHMS[i % len(ALGORITHMS)]
            zcoll.allreduce(world, x, r, algorithm=alg)
            ok &= r[0] == world.size
            if i % 10 == 0:
                ok &= zcoll.allreduce(world, x, op=MPI.MAX)[0] == 1
                zcoll.bcast(world, r, root=i % world.size)
                zcoll.reduce(world, x, r, root=0)
                zcoll.barrier(world)
        return bool(ok)

    ok = loop(2_000)
    gc.collect()
    world.Barrier()
    rss0, in_use0 = rss(), ctx.core.arena_bytes_in_use
    ok &= loop(10_000)
    gc.collect()
    world.Barrier()
    grew = rss() - rss0
    all_ranks_agree(world, ok, "wrong results during the loop")
    all_ranks_agree(world, grew < 2**20, f"RSS grew by {grew / 2**20:.2f} MiB")
    all_ranks_agree(world, ctx.core.arena_bytes_in_use == in_use0, "arena bytes in use changed")


def test_bcast_of_a_non_array_and_reduce_on_a_freed_comm(world):
    buf = [1.0, 2.0] if last(world) else np.zeros(2)
    expect_everywhere(world, lambda: zcoll.bcast(world, buf), TypeError,
                      fragment="buf must be a numpy.ndarray")  # fmt: skip
    dup = world.Dup()
    dup.Free()
    with pytest.raises(ValueError, match="COMM_NULL"):
        zcoll.reduce(dup, np.ones(3))
    with pytest.raises(ValueError, match="COMM_NULL"):
        zcoll.allreduce(dup, np.ones(3))


@pytest.mark.parametrize("path", PRIVATE_PATHS)
def test_bcast_of_a_private_root_buffer(comm, path):
    """A plain NumPy root buffer pulled by CMA or staged, every root, small to 2 MiB."""
    failures = []
    with private_buffers_by(comm, path):
        for root in range(comm.size):
            for n in (1, 3000, 262_144):
                buf = np.full(n, comm.rank, np.float64) + np.arange(n)
                zcoll.bcast(comm, buf, root=root)
                if not np.array_equal(buf, root + np.arange(n, dtype=np.float64)):
                    failures.append((root, n))
    all_ranks_agree(comm, not failures, f"bcast {path}: {failures}")


def test_bcast_of_a_private_root_buffer_rewritten_between_calls(comm):
    """A private root buffer under the measured rule (staged below the pull threshold), new
    data in the same buffers before every call, every root, bit for bit."""
    failures = []
    for root in range(comm.size):
        for n in (2_000, 8_000, 32_000):  # 16, 64 and 256 KiB
            for call in range(8):
                value = 1000.0 * call + root
                buf = np.full(n, value if comm.rank == root else -1.0) + np.arange(n)
                zcoll.bcast(comm, buf, root=root)
                if not np.array_equal(buf, value + np.arange(n, dtype=np.float64)):
                    failures.append((root, n, call))
    all_ranks_agree(comm, not failures, f"bcast of rewritten buffers: {failures}")


@pytest.mark.parametrize("path", PRIVATE_PATHS)
@pytest.mark.parametrize("algorithm", ["auto", "tiled", "flat"])
def test_reductions_of_private_inputs(comm, path, algorithm):
    """Plain NumPy inputs, pulled by CMA a piece at a time (tiled and flat) or staged: on every
    rank, on some (the others' in the arena), in place; allreduce, reduce at every root,
    reduce_scatter_block; sizes whose tiles span several pulled pieces. Integers against MPI,
    float32 tiled against NumPy's rank-order fold bit for bit (on one node; across nodes within
    the bound)."""
    p = comm.size
    failures = []
    with private_buffers_by(comm, path):
        for n in (3, 40_003, 200_000):
            x = seeded(comm, n, n, np.int64)
            for mode in ("private", "mixed", "in_place"):
                in_arena = make(comm, x, True)  # collective: every rank makes one
                src = in_arena if mode == "mixed" and comm.rank % 2 == 0 else x.copy()
                if mode == "in_place":
                    got = zcoll.allreduce(comm, zcoll.IN_PLACE, src, algorithm=algorithm)
                else:
                    got = zcoll.allreduce(comm, src, algorithm=algorithm)
                    if not np.array_equal(src, x):
                        failures.append((n, mode, "input changed"))
                if why := check_against_mpi(comm, x, got, "sum"):
                    failures.append((n, mode, why))
            for root in range(p):
                want = np.empty_like(x) if comm.rank == root else None
                comm.Reduce(x, want, op=MPI.SUM, root=root)
                got = zcoll.reduce(comm, x, root=root, algorithm=algorithm)
                if comm.rank == root and not np.array_equal(got, want):
                    failures.append((n, "reduce", root))
                # The root's result given: plain (peers write their tiles by CMA), in the
                # arena (peers write them in place) and in place at the root.
                in_arena = zcoll.empty(comm, x.shape, x.dtype)  # collective
                for out in ("plain", "arena", "in_place"):
                    into = {"plain": np.zeros_like(x), "arena": in_arena, "in_place": x.copy()}
                    mine = into[out]
                    send = zcoll.IN_PLACE if out == "in_place" and comm.rank == root else x
                    zcoll.reduce(comm, send, mine, root=root, algorithm=algorithm)
                    if comm.rank == root and not np.array_equal(mine, want):
                        failures.append((n, "reduce into", out, root))
            block = n // p
            want = np.empty(block, np.int64)
            comm.Reduce_scatter_block(x[: p * block], want, op=MPI.SUM)
            got = zcoll.reduce_scatter_block(comm, x[: p * block], algorithm=algorithm)
            if not np.array_equal(got, want):
                failures.append((n, "reduce_scatter_block"))
            y = seeded(comm, n + 1, n, np.float32)
            got = zcoll.allreduce(comm, y, algorithm="tiled")
            if not single_node(comm):  # across nodes the order is not rank order
                if why := check_against_mpi(comm, y, got, "sum"):
                    failures.append((n, "float32", why))
            elif got.tobytes() != numpy_fold(comm, y, "sum").tobytes():
                failures.append((n, "float32 tiled not NumPy's rank-order fold"))
    all_ranks_agree(comm, not failures, f"{path} {algorithm}: {failures}")


def test_auto_runs_tiled_when_private_inputs_are_pulled(world):
    """What "auto" runs for private inputs: tiled (the one algorithm that pulls) from the CMA
    threshold up when CMA works, the size's own choice below it and when refused."""
    ctx = zcoll._context.context(world)
    core = ctx.core
    big = 1 << 22
    shared = core.reduction_choice(big)
    pulled = core.reduction_choice(big, private_inputs=True)
    works = core.cma[0] == "works" and ctx.node_size > 1
    ok = pulled == ("tiled" if works else shared)
    ok &= core.reduction_choice(8, private_inputs=True) == core.reduction_choice(8)
    all_ranks_agree(world, ok, f"shared {shared}, pulled {pulled}, cma {core.cma}")


def _python_path_reached(*args, **kwargs):
    raise AssertionError("the Python path ran")


def test_mpi_ops_take_the_one_crossing(world, monkeypatch):
    """op= given as mpi4py's MPI.SUM ... MPI.BXOR: allreduce, reduce and reduce_scatter_block
    on a communicator zcoll has used take the one crossing that op names take (the Python
    path raises here), on one node and across virtual and emulated nodes, with mpi4py's
    results (integers: every op is exact)."""
    p, me = world.size, world.rank
    comm = world.Dup()
    try:
        zcoll.allreduce(comm, np.ones(1))  # the first call makes the context
        monkeypatch.setattr(_reductions, "_reduction", _python_path_reached)
        failures = []
        for name, mpi_op in MPI_OPS.items():
            x = (np.arange(6 * p, dtype=np.int64) * (me + 3) + OPS.index(name)) % 7
            want, got = np.empty_like(x), np.empty_like(x)
            comm.Allreduce(x, want, op=mpi_op)
            zcoll.allreduce(comm, x, got, op=mpi_op)
            at_root = np.zeros_like(x)
            zcoll.reduce(comm, x, at_root, op=mpi_op, root=p - 1)
            part, want_part = np.empty(6, np.int64), np.empty(6, np.int64)
            comm.Reduce_scatter_block(x, want_part, op=mpi_op)
            zcoll.reduce_scatter_block(comm, x, part, op=mpi_op)
            if not np.array_equal(got, want):
                failures.append(("allreduce", name))
            if me == p - 1 and not np.array_equal(at_root, want):
                failures.append(("reduce", name))
            if not np.array_equal(part, want_part):
                failures.append(("reduce_scatter_block", name))
    finally:
        monkeypatch.undo()
        comm.Free()
    all_ranks_agree(world, not failures, f"MPI.Op: {failures}")
