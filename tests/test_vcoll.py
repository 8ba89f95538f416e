"""alltoallv, allgatherv and the neighbourhood collectives, bit for bit against mpi4py.

The references are mpi4py's own collectives on byte views of the same data (every bit pattern,
NaNs and padding bytes included), on receive buffers pre-filled with random bytes, so that the
holes between blocks (and PROC_NULL slots) must come out untouched: the whole buffer is compared.
Counts are seeded (zeros, gaps, permuted and overlapping send blocks, holes between receive
blocks), over every dtype family, every buffer specification mpi4py takes, arena and private
buffers, in place where MPI allows it, every order and copy mode, every communicator kind.

The neighbourhood collectives run on Cartesian grids (1-3 dimensions, periodic or not, with
dimensions of 1 and 2) and distributed graphs (asymmetric, self-loops, repeated edges,
weighted or not, adjacent and general constructors, ranks of in- or out-degree 0), against
mpi4py's blocking collectives with explicit counts; vcoll_reference.py explains why (Open MPI
4.1's MPI_ERR_TRUNCATE on implicit counts, open-mpi/ompi#14452) and holds a point-to-point
reference written from the MPI-4.1 text, itself checked against mpi4py here, which judges the
calls Open MPI cannot.

Bad input on one rank: the same ValueError/TypeError on every rank, no receive buffer written,
and the next call on the communicator right.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np
import pytest
from mpi4py import MPI

import zcoll
from helpers import (
    ARENA_SIDES,
    DTYPES,
    PRIVATE_PATHS,
    all_ranks_agree,
    arena_sides,
    private_buffers_by,
)
from helpers import vcoll_reference as ref
from zcoll import _context

# "numa" runs as Morton in the irregular engine (test_vexchange.cpp checks it): not repeated here.
ORDERS = ["auto", *(o for o in zcoll.ORDERS if o != "numa")]
COPIES = ["auto", *zcoll.COPY_MODES]
MODES = ["arena", "private", "mixed"]  # send / receive in the arena, both private, one each

# mpi4py's buffer specifications of the v-variants (counts and displacements in elements):
# "array" (split evenly), "counts" ([a, counts], packed), "tuple" ([a, (counts, displs)]),
# "three" ([a, counts, displs]), "tuple_type" ([a, (counts, displs), datatype]), "four"
# ([a, counts, displs, datatype]), "int_count" ([a, c]: c to every peer, packed) and
# "strided" ([a, (c, stride)]: block i at i * stride) -- mpi4py's integer forms -- and
# "array_type" ([a, datatype], split evenly).
UNIFORM_FORMS = ("array", "array_type", "int_count", "strided")
FREE_FORMS = ("tuple", "three", "tuple_type", "four")
PACKED_FORMS = ("counts",)
V_FORMS = (*FREE_FORMS, *PACKED_FORMS, *UNIFORM_FORMS)
# The forms drawn at random everywhere; "strided" has its own tests
# (test_alltoallv_every_buffer_specification, test_neighbor_v_strided_specification), so
# that a failure there names itself instead of failing every test.
POOL_FORMS = tuple(f for f in V_FORMS if f != "strided")
TYPED_FORMS = ("tuple_type", "four", "array_type")


def make(comm, shape, dtype, arena: bool) -> np.ndarray:
    """An arena array (collective over `comm`) or a private one."""
    return zcoll.empty(comm, shape, dtype) if arena else np.empty(shape, dtype)


def arena_pair(mode: str, case: int) -> tuple[bool, bool]:
    """(send in arena, receive in arena) of a buffer mode; "mixed" alternates which side."""
    if mode == "arena":
        return True, True
    if mode == "private":
        return False, False
    return (True, False) if case % 2 else (False, True)


def vspec(form: str, a: np.ndarray, counts, displs):
    """The zcoll (and mpi4py) buffer specification `form` of array `a`."""
    counts = np.asarray(counts, np.int64)
    displs = np.asarray(displs, np.int64)
    datatype = ref.mpi_datatype(a.dtype)
    if form in TYPED_FORMS and datatype is None:  # float16: MPI has no such datatype
        form = {"tuple_type": "tuple", "four": "three", "array_type": "array"}[form]
    if form == "array":
        return a
    if form == "array_type":
        return [a, datatype]
    if form == "counts":
        return [a, counts.tolist()]
    if form == "tuple":
        return [a, (counts.tolist(), displs.tolist())]
    if form == "three":
        return [a, counts.tolist(), displs.tolist()]
    if form == "tuple_type":
        return [a, (counts, displs), datatype]  # NumPy arrays of counts, as well
    if form == "four":
        return [a, counts.astype(np.int32), displs, datatype]
    if form == "int_count":
        return [a, int(counts[0]) if counts.size else 0]
    if form == "strided":
        stride = int(displs[1] - displs[0]) if displs.size > 1 else 0
        return [a, (int(counts[0]) if counts.size else 0, stride)]
    raise AssertionError(form)


def side_layout(form: str, rng, counts, *, send: bool) -> tuple[np.ndarray, int]:
    """Displacements and buffer size for `counts` that the specification `form` can express."""
    counts = np.asarray(counts, np.int64)
    n = counts.size
    if form in ("array", "array_type"):
        return ref.packed_displs(counts), int(counts.sum())
    if form in ("counts", "int_count"):
        return ref.packed_displs(counts), int(counts.sum()) + int(rng.integers(0, 4))
    if form == "strided":
        c = int(counts[0]) if n else 0
        stride = c + int(rng.integers(0, 4))
        return np.arange(n, dtype=np.int64) * stride, n * stride + int(rng.integers(0, 3))
    return ref.layout(rng, counts, overlap=send and rng.random() < 0.3)


def shaped(rng, size: int) -> tuple[int, ...]:
    """A 1-D shape, or 2-D where the size allows (counts are in elements of the flat array)."""
    if size and size % 2 == 0 and rng.random() < 0.3:
        return (size // 2, 2)
    return (size,)


def pick_forms(rng_g) -> tuple[str, str]:
    """(send form, receive form), the same on every rank."""
    return str(rng_g.choice(POOL_FORMS)), str(rng_g.choice(POOL_FORMS))


def seeded_rngs(comm, seed: list[int]) -> tuple[np.random.Generator, np.random.Generator]:
    """(the same generator on every rank, this rank's own), both from `seed`."""
    return np.random.default_rng(seed), np.random.default_rng([*seed, comm.rank])


def guarded(fn, *args, **kwargs):
    """fn(*args, **kwargs) -- a zcoll call -- and its exception, if any, as a failure text
    instead (keeps the ranks in step when every rank raises)."""
    try:
        return fn(*args, **kwargs), None
    except Exception as exc:  # noqa: BLE001 - reported as a test failure on every rank
        return None, f"{type(exc).__name__}: {exc}"


# --- alltoallv --------------------------------------------------------------------------------


def alltoallv_case(comm, rng_g, rng_l, dtype, order, copy, send_arena, recv_arena,
                   forms=None, large: int = 0, in_place: bool = False) -> str | None:  # fmt: skip
    """One seeded alltoallv against comm.Alltoallv; a failure description or None."""
    p, me = comm.size, comm.rank
    send_form, recv_form = forms or pick_forms(rng_g)
    if in_place:
        send_form = "in_place"
    if send_form in UNIFORM_FORMS or recv_form in UNIFORM_FORMS:
        counts = np.full((p, p), int(rng_g.choice([0, 1, 5, 33])), np.int64)
    else:
        counts = ref.count_matrix(rng_g, p, large=large)
    if in_place:  # MPI's in-place alltoallv: recvcounts serve both directions
        counts = np.triu(counts) + np.triu(counts, 1).T
    scounts, rcounts = counts[me, :], counts[:, me]
    rdispls, rsize = side_layout(recv_form, rng_l, rcounts, send=False)
    recv = make(comm, shaped(rng_l, rsize), dtype, recv_arena)
    ref.random_fill(recv, rng_l)
    expected = recv.copy()
    if in_place:
        ref.mpi_alltoallv(comm, MPI.IN_PLACE, None, None, expected, rcounts, rdispls)
        sendspec = zcoll.IN_PLACE
    else:
        sdispls, ssize = side_layout(send_form, rng_l, scounts, send=True)
        send = make(comm, shaped(rng_l, ssize), dtype, send_arena)
        ref.random_fill(send, rng_l)
        ref.mpi_alltoallv(comm, send, scounts, sdispls, expected, rcounts, rdispls)
        sendspec = vspec(send_form, send, scounts, sdispls)
    recvspec = vspec(recv_form, recv, rcounts, rdispls)
    got, error = guarded(zcoll.alltoallv, comm, sendspec, recvspec, order=order, copy=copy)
    what = f"{np.dtype(dtype).name} forms={send_form}/{recv_form} order={order} copy={copy}"
    if error:
        return f"{what}: {error}"
    if got is not recv:
        return f"{what}: did not return recvbuf's array"
    if not ref.same_bits(recv, expected):
        return f"{what}: {ref.first_difference(recv, expected)}"
    return None


@pytest.mark.parametrize("order", ORDERS)
def test_alltoallv_matches_mpi(comm, order):
    """Every dtype, every buffer mode and specification, copy modes in turn."""
    rng_g = np.random.default_rng([1, ORDERS.index(order)])
    rng_l = np.random.default_rng([1, ORDERS.index(order), comm.rank])
    failures = []
    for case, dtype in enumerate(DTYPES * 2):
        send_arena, recv_arena = arena_pair(MODES[case % 3], case // 3)
        copy = COPIES[case % len(COPIES)]
        failure = alltoallv_case(comm, rng_g, rng_l, dtype, order, copy, send_arena, recv_arena)
        if failure:
            failures.append(failure)
    all_ranks_agree(comm, not failures, f"alltoallv order={order}: {failures}")


@pytest.mark.parametrize("form", V_FORMS)
def test_alltoallv_every_buffer_specification(world, form):
    """Each specification on both sides, on every dtype family (the datatype forms name
    mpi4py's datatype of the dtype)."""
    rng_g = np.random.default_rng([2, V_FORMS.index(form)])
    rng_l = np.random.default_rng([2, V_FORMS.index(form), world.rank])
    failures = []
    for case, dtype in enumerate(DTYPES):
        other = POOL_FORMS[case % len(POOL_FORMS)]
        forms = (form, other) if case % 2 else (other, form)
        failure = alltoallv_case(world, rng_g, rng_l, dtype, ORDERS[case % 5], "auto",
                                 case % 2 == 0, case % 3 == 0, forms=forms)  # fmt: skip
        if failure:
            failures.append(failure)
    all_ranks_agree(world, not failures, f"alltoallv form={form}: {failures}")


# (dtype, names of mpi4py datatypes that describe it), the C names; absent ones are skipped
SYNONYMS = [
    (np.int64, ["INT64_T", "LONG_LONG", "LONG"]), (np.uint8, ["UINT8_T", "BYTE"]),
    (np.int8, ["INT8_T", "SIGNED_CHAR"]), (np.uint64, ["UINT64_T", "UNSIGNED_LONG_LONG"]),
    (np.int32, ["INT32_T", "INT"]), (np.float32, ["FLOAT"]), (np.bool_, ["C_BOOL"]),
    (np.complex128, ["C_DOUBLE_COMPLEX"]), (np.complex64, ["C_FLOAT_COMPLEX"]),
]  # fmt: skip


def test_datatype_synonyms(world):
    """Any mpi4py datatype of the array's dtype is accepted in a specification (MPI.INT64_T and
    MPI.LONG_LONG for int64, MPI.BYTE for uint8, ...), as comm.Alltoallv accepts them."""
    p, me = world.size, world.rank
    failures = []
    for dtype, names in SYNONYMS:
        for name in names:
            datatype = getattr(MPI, name, MPI.DATATYPE_NULL)
            if datatype == MPI.DATATYPE_NULL:
                continue
            counts = [1 + (me + j) % 2 for j in range(p)]
            rcounts = [1 + (j + me) % 2 for j in range(p)]
            send = (np.arange(sum(counts)) + 10 * me).astype(dtype)
            recv = np.zeros(sum(rcounts) + 1, dtype)
            expected = recv.copy()
            ref.mpi_alltoallv(world, send, counts, ref.packed_displs(counts), expected, rcounts,
                              ref.packed_displs(rcounts))  # fmt: skip
            _, error = guarded(zcoll.alltoallv, world, [send, counts, None, datatype],
                               [recv, (rcounts, ref.packed_displs(rcounts)), datatype])  # fmt: skip
            if error or not ref.same_bits(recv, expected):
                failures.append((np.dtype(dtype).name, name, error))
    all_ranks_agree(world, not failures, f"datatype synonyms: {failures}")


@pytest.mark.parametrize("mode", ["arena", "private"])
def test_alltoallv_in_place_matches_mpi(comm, mode):
    """MPI_IN_PLACE: recvbuf's counts and displacements for both directions (symmetric
    counts), holes untouched."""
    rng_g = np.random.default_rng([3, mode == "arena"])
    rng_l = np.random.default_rng([3, mode == "arena", comm.rank])
    failures = []
    for case, dtype in enumerate(DTYPES):
        forms = ("in_place", str(rng_g.choice(FREE_FORMS + PACKED_FORMS)))
        failure = alltoallv_case(comm, rng_g, rng_l, dtype, ORDERS[case % 5],
                                 COPIES[case % 4], False, mode == "arena", forms=forms,
                                 in_place=True)  # fmt: skip
        if failure:
            failures.append(failure)
    all_ranks_agree(comm, not failures, f"in-place alltoallv mode={mode}: {failures}")


@pytest.mark.parametrize("copy", COPIES)
@pytest.mark.parametrize("order", ORDERS)
def test_alltoallv_large_blocks(world, order, copy):
    """Blocks of ~160-320 KiB next to empty and small ones: past the eager path, through the
    ordered schedule, in every copy mode."""
    rng_g = np.random.default_rng([4, ORDERS.index(order), COPIES.index(copy)])
    rng_l = np.random.default_rng([4, ORDERS.index(order), COPIES.index(copy), world.rank])
    failures = []
    for case, dtype in enumerate([np.float64, np.complex128, np.uint8]):
        send_arena, recv_arena = arena_pair(MODES[case], case)
        failure = alltoallv_case(world, rng_g, rng_l, dtype, order, copy, send_arena, recv_arena,
                                 forms=("four", "tuple"), large=20_000)  # fmt: skip
        if failure:
            failures.append(failure)
    all_ranks_agree(world, not failures, f"large alltoallv order={order} copy={copy}: {failures}")


# --- allgatherv -------------------------------------------------------------------------------

SEND_FORMS = ("array", "count", "count_type")


def allgatherv_case(comm, rng_g, rng_l, dtype, order, copy, send_arena, recv_arena,
                    recv_form=None, in_place=False, new=False) -> str | None:  # fmt: skip
    """One seeded allgatherv against comm.Allgatherv; `new`: recvbuf=None (a packed 1-D arena
    array is expected)."""
    p, me = comm.size, comm.rank
    recv_form = recv_form or str(rng_g.choice(POOL_FORMS))
    send_form = str(rng_g.choice(SEND_FORMS))
    if recv_form in UNIFORM_FORMS:
        counts = np.full(p, int(rng_g.choice([0, 2, 9])), np.int64)
    else:
        counts = rng_g.integers(0, 30, p).astype(np.int64)
        counts[rng_g.random(p) < 0.3] = 0
    mine = int(counts[me])
    what = f"{np.dtype(dtype).name} send={send_form} recv={recv_form} order={order} copy={copy}"
    if new:
        rdispls, rsize = ref.packed_displs(counts), int(counts.sum())
        expected = np.empty(rsize, dtype)
    else:
        rdispls, rsize = side_layout(recv_form, rng_l, counts, send=False)
        recv = make(comm, shaped(rng_l, rsize), dtype, recv_arena)
        ref.random_fill(recv, rng_l)
    # this rank's block, with spare elements after it where the form names a count
    spare = 0 if send_form == "array" else int(rng_l.integers(0, 3))
    send = make(comm, mine + spare, dtype, send_arena)
    ref.random_fill(send, rng_l)
    if in_place:
        k = recv.itemsize
        start = int(rdispls[me]) * k
        ref.as_bytes(recv)[start : start + mine * k] = ref.as_bytes(send)[: mine * k]
        expected = recv.copy()
        ref.mpi_allgatherv(comm, MPI.IN_PLACE, None, expected, counts, rdispls)
        sendspec = zcoll.IN_PLACE
    else:
        if not new:
            expected = recv.copy()
        ref.mpi_allgatherv(comm, send, mine, expected, counts, rdispls)
        datatype = ref.mpi_datatype(dtype)
        if send_form == "array":
            sendspec = send
        elif send_form == "count" or datatype is None:
            sendspec = [send, mine]
        else:
            sendspec = [send, mine, datatype]
    if new:
        got, error = guarded(zcoll.allgatherv, comm, sendspec, order=order, copy=copy)
        if error:
            return f"{what} recvbuf=None: {error}"
        if not isinstance(got, np.ndarray) or got.shape != (rsize,) or got.dtype != np.dtype(dtype):
            return f"{what} recvbuf=None: got {getattr(got, 'shape', got)}, want ({rsize},) {dtype}"
        if not zcoll.is_shared(got):
            return f"{what} recvbuf=None: the result is not an arena array"
        if not ref.same_bits(got, expected):
            return f"{what} recvbuf=None: {ref.first_difference(got, expected)}"
        return None
    recvspec = vspec(recv_form, recv, counts, rdispls)
    got, error = guarded(zcoll.allgatherv, comm, sendspec, recvspec, order=order, copy=copy)
    if error:
        return f"{what}: {error}"
    if got is not recv:
        return f"{what}: did not return recvbuf's array"
    if not ref.same_bits(recv, expected):
        return f"{what}: {ref.first_difference(recv, expected)}"
    return None


@pytest.mark.parametrize("order", ORDERS)
def test_allgatherv_matches_mpi(comm, order):
    rng_g = np.random.default_rng([5, ORDERS.index(order)])
    rng_l = np.random.default_rng([5, ORDERS.index(order), comm.rank])
    failures = []
    for case, dtype in enumerate(DTYPES * 2):
        send_arena, recv_arena = arena_pair(MODES[case % 3], case // 3)
        failure = allgatherv_case(comm, rng_g, rng_l, dtype, order, COPIES[case % 4],
                                  send_arena, recv_arena)  # fmt: skip
        if failure:
            failures.append(failure)
    all_ranks_agree(comm, not failures, f"allgatherv order={order}: {failures}")


@pytest.mark.parametrize("path", PRIVATE_PATHS)
@pytest.mark.parametrize("op", ["alltoallv", "allgatherv"])
def test_private_buffers_match_mpi(comm, op, path):
    """Plain NumPy buffers (both sides, or one) pulled by CMA or staged whatever their size:
    every dtype, seeded counts and specifications."""
    seed = [6, PRIVATE_PATHS.index(path), op == "allgatherv"]
    rng_g, rng_l = seeded_rngs(comm, seed)
    case_of = alltoallv_case if op == "alltoallv" else allgatherv_case
    failures = []
    with private_buffers_by(comm, path):
        for case, dtype in enumerate(DTYPES):
            send_arena, recv_arena = arena_pair(MODES[1 + case % 2], case // 2)
            failure = case_of(comm, rng_g, rng_l, dtype, "auto", "auto", send_arena, recv_arena)
            if failure:
                failures.append(failure)
    all_ranks_agree(comm, not failures, f"{op} {path}: {failures}")


@pytest.mark.parametrize("received", [6 << 10, 12 << 10, 24 << 10])
@pytest.mark.parametrize("buffers", ARENA_SIDES)
def test_private_buffers_past_the_eager_size(comm, buffers, received):
    """alltoallv and allgatherv receiving 6, 12 and 24 KiB per rank under the measured rules:
    plain buffers between the eager size and the eager slots' capacity go through the slots,
    beyond it they are staged or pulled, and a call whose ranks differ (arena on one rank,
    plain on the others: "by rank") takes the path they all can. Bits as MPI's."""
    p, me = comm.size, comm.rank
    count = max(1, received // (8 * p))
    send_arena, recv_arena = arena_sides(buffers, me)

    def array(n: int, arena: bool) -> np.ndarray:
        shared = zcoll.empty(comm, n)  # collective: every rank makes one, some use it
        return shared if arena else np.empty(n)

    rng = np.random.default_rng([17, me, received])
    counts = np.full(p, count, np.int64)
    displs = ref.packed_displs(counts)
    failures = []
    send = array(p * count, send_arena)
    send[...] = rng.random(send.size)
    recv = array(p * count, recv_arena)
    expected = np.full(recv.shape, -1.0)
    recv[...] = -1.0
    ref.mpi_alltoallv(comm, send, counts, displs, expected, counts, displs)
    zcoll.alltoallv(comm, [send, counts], [recv, counts])
    if not ref.same_bits(recv, expected):
        failures.append(f"alltoallv: {ref.first_difference(recv, expected)}")
    mine = array(count, send_arena)
    mine[...] = rng.random(count)
    expected[...] = -1.0
    recv[...] = -1.0
    ref.mpi_allgatherv(comm, mine, count, expected, counts, displs)
    zcoll.allgatherv(comm, mine, [recv, counts])
    if not ref.same_bits(recv, expected):
        failures.append(f"allgatherv: {ref.first_difference(recv, expected)}")
    all_ranks_agree(comm, not failures, f"{buffers}, {received} B received: {failures}")


@pytest.mark.parametrize("pushes", ["measured", "never"])
@pytest.mark.parametrize("buffers", ARENA_SIDES)
def test_pulled_alltoallv_with_one_busy_receiver(comm, buffers, pushes):
    """An alltoallv pulled by CMA whose bytes all go to rank 0 (48 KiB from every rank, nothing
    to the others, holes between the blocks): under the measured rule the other ranks push the
    tails of rank 0's blocks into its buffer, or with pushes off it pulls them all. The whole
    receive buffer, holes included, as MPI's."""
    p, me = comm.size, comm.rank
    big, small, hole = 6144, 0, 3  # float64 elements
    send_arena, recv_arena = arena_sides(buffers, me)

    def array(n: int, arena: bool) -> np.ndarray:
        shared = zcoll.empty(comm, n)  # collective: every rank makes one, some use it
        return shared if arena else np.empty(n)

    scounts = np.array([big if peer == 0 else small for peer in range(p)], np.int64)
    rcounts = np.full(p, big if me == 0 else small, np.int64)
    sdispls = ref.packed_displs(scounts)
    rdispls = ref.packed_displs(rcounts + hole)
    send = array(int(scounts.sum()), send_arena)
    send[...] = np.random.default_rng([23, me]).random(send.size)
    recv = array(int((rcounts + hole).sum()), recv_arena)
    expected = np.full(recv.shape, -1.0)
    recv[...] = -1.0
    ref.mpi_alltoallv(comm, send, scounts, sdispls, expected, rcounts, rdispls)
    core = _context.context(comm).core
    before = core.cma_bytes, core.cma_push_bytes
    core.cma_bytes = 0
    if pushes == "never":
        core.cma_push_bytes = 2**62
    try:
        zcoll.alltoallv(comm, [send, (scounts, sdispls)], [recv, (rcounts, rdispls)])
    finally:
        core.cma_bytes, core.cma_push_bytes = before
    ok = ref.same_bits(recv, expected)
    all_ranks_agree(comm, ok, f"{buffers}: {'' if ok else ref.first_difference(recv, expected)}")


@pytest.mark.parametrize("mode", ["arena", "private"])
def test_allgatherv_in_place_matches_mpi(comm, mode):
    """This rank's block already at recvbuf[displs[rank]:]; the holes untouched."""
    rng_g = np.random.default_rng([6, mode == "arena"])
    rng_l = np.random.default_rng([6, mode == "arena", comm.rank])
    failures = []
    for case, dtype in enumerate(DTYPES):
        failure = allgatherv_case(comm, rng_g, rng_l, dtype, ORDERS[case % 5], COPIES[case % 4],
                                  False, mode == "arena", in_place=True)  # fmt: skip
        if failure:
            failures.append(failure)
    all_ranks_agree(comm, not failures, f"in-place allgatherv mode={mode}: {failures}")


def test_allgatherv_without_recvbuf(comm):
    """recvbuf=None: the counts are gathered and a packed 1-D arena array returned."""
    rng_g = np.random.default_rng(7)
    rng_l = np.random.default_rng([7, comm.rank])
    failures = []
    for case, dtype in enumerate(DTYPES):
        failure = allgatherv_case(comm, rng_g, rng_l, dtype, ORDERS[case % 5], COPIES[case % 4],
                                  case % 2 == 0, False, recv_form="tuple", new=True)  # fmt: skip
        if failure:
            failures.append(failure)
    all_ranks_agree(comm, not failures, f"allgatherv recvbuf=None: {failures}")


def test_allgatherv_large_blocks(world):
    rng_l = np.random.default_rng([8, world.rank])
    failures = []
    for case, (order, copy) in enumerate(zip(ORDERS, COPIES + ["auto"])):
        p = world.size
        counts = np.where(np.arange(p) % 2 == 0, 30_000 + case, 0).astype(np.int64)
        rdispls, rsize = ref.layout(rng_l, counts)
        recv = make(world, rsize, np.float64, case % 2 == 0)
        ref.random_fill(recv, rng_l)
        send = make(world, int(counts[world.rank]), np.float64, case % 3 == 0)
        ref.random_fill(send, rng_l)
        expected = recv.copy()
        ref.mpi_allgatherv(world, send, send.size, expected, counts, rdispls)
        recvspec = [recv, (counts, rdispls)]
        _, error = guarded(zcoll.allgatherv, world, send, recvspec, order=order, copy=copy)
        if error or not ref.same_bits(recv, expected):
            failures.append((order, copy, error or ref.first_difference(recv, expected)))
    all_ranks_agree(world, not failures, f"large allgatherv: {failures}")


# --- copy modes, structured dtypes, arena arrays of another communicator ---------------------


@contextlib.contextmanager
def hybrid_threshold(comm, nbytes: int):
    """`comm`'s context with its hybrid-copy threshold at `nbytes` and "auto" allowed to
    stream calls that fit in cache (as tests/test_collectives.py does); restored afterwards."""
    core = zcoll._context.context(comm).core
    old, cache = core.copy_threshold(0), core.copy_cache
    core.set_copy_threshold(nbytes)
    core.set_copy_cache(0)
    try:
        yield
    finally:
        core.set_copy_threshold(old)
        core.set_copy_cache(cache)


@pytest.mark.parametrize("copy", COPIES)
def test_copy_modes_with_a_threshold_inside_the_blocks(comm, copy):
    """A 100-byte hybrid threshold: blocks cut between temporal and streaming stores, and
    "auto" choosing streaming or hybrid copies for small calls too."""
    rng_g = np.random.default_rng([16, COPIES.index(copy)])
    rng_l = np.random.default_rng([16, COPIES.index(copy), comm.rank])
    failures = []
    with hybrid_threshold(comm, 100):
        for case, dtype in enumerate([np.uint8, np.float64, np.complex128, np.int16]):
            send_arena, recv_arena = arena_pair(MODES[case % 3], case)
            failure = alltoallv_case(comm, rng_g, rng_l, dtype, ORDERS[case], copy, send_arena,
                                     recv_arena, large=3000 if case % 2 else 0)  # fmt: skip
            failure = failure or allgatherv_case(comm, rng_g, rng_l, dtype, ORDERS[case + 1],
                                                 copy, send_arena, recv_arena)  # fmt: skip
            if failure:
                failures.append(failure)
    all_ranks_agree(comm, not failures, f"copy={copy}, threshold 100 B: {failures}")


STRUCTURED = np.dtype([("a", "<i2"), ("b", "<f8"), ("c", "u1")])  # 11 bytes, unaligned fields


def test_structured_dtype(world, topologies):
    """A packed structured dtype (11-byte elements) through every v-collective."""
    rng_g = np.random.default_rng(17)
    rng_l = np.random.default_rng([17, world.rank])
    failures = []
    for case in range(3):
        failures.append(alltoallv_case(world, rng_g, rng_l, STRUCTURED, ORDERS[case], "auto",
                                       case == 0, case == 1))  # fmt: skip
        failures.append(allgatherv_case(world, rng_g, rng_l, STRUCTURED, ORDERS[case + 2],
                                        "auto", case == 1, case == 0, new=case == 2))  # fmt: skip
    comm = topologies("graph_adjacent")
    if member(comm):
        rng_l = np.random.default_rng([17, 1, comm.rank])
        for case, op in enumerate(NEIGHBOR_OPS):
            failures.append(neighbor_case(comm, rng_g, rng_l, op, STRUCTURED, ORDERS[case],
                                          "auto", case % 2 == 0, True))  # fmt: skip
    failures = [f for f in failures if f]
    all_ranks_agree(world, not failures, f"structured dtype: {failures}")


def test_world_arena_arrays_on_other_communicators(world):
    """Arena arrays allocated on WORLD, used by alltoallv on a reversed split and by
    neighbor_alltoallv on a Cartesian communicator made from WORLD (no staging needed)."""
    rev = world.Split(0, key=world.size - 1 - world.rank)
    cart = world.Create_cart([world.size], periods=[True], reorder=False)
    rng_l = np.random.default_rng([18, world.rank])
    failures = []
    try:
        for round_ in range(3):
            p, me = rev.size, rev.rank
            counts = 1 + (np.arange(p)[:, None] * 3 + np.arange(p)[None, :] + round_) % 4
            sc, rc = counts[me], counts[:, me]
            sd, ssize = ref.layout(rng_l, sc, overlap=True)
            rd, rsize = ref.layout(rng_l, rc)
            send = zcoll.empty(world, ssize, np.complex64)
            recv = zcoll.empty(world, rsize, np.complex64)
            ref.random_fill(send, rng_l)
            ref.random_fill(recv, rng_l)
            expected = recv.copy()
            ref.mpi_alltoallv(rev, send, sc, sd, expected, rc, rd)
            _, error = guarded(zcoll.alltoallv, rev, [send, (sc, sd)], [recv, (rc, rd)],
                               order=ORDERS[round_])  # fmt: skip
            if error or not ref.same_bits(recv, expected):
                failures.append(("split", round_, error or ref.first_difference(recv, expected)))
            c = 2 + round_
            send = zcoll.empty(world, 2 * c + 1, np.int32)
            recv = zcoll.empty(world, 2 * c + 2, np.int32)
            ref.random_fill(send, rng_l)
            ref.random_fill(recv, rng_l)
            expected = recv.copy()
            sd, rd = [c + 1, 0], [0, c + 2]
            ref.neighbor_reference("alltoallv")(cart, send, [c, c], sd, expected, [c, c], rd)
            _, error = guarded(zcoll.neighbor_alltoallv, cart, [send, [c, c], sd],
                               [recv, ([c, c], rd)], order=ORDERS[round_ + 1])  # fmt: skip
            if error or not ref.same_bits(recv, expected):
                failures.append(("cart", round_, error or ref.first_difference(recv, expected)))
    finally:
        rev.Free()
        cart.Free()
    all_ranks_agree(world, not failures, f"WORLD's arena arrays elsewhere: {failures}")


def encoded(call: int, src: int, dst: int, count: int) -> np.ndarray:
    """Closed form: element k of the block src -> dst in call `call`."""
    return call * 10**9 + src * 10**6 + dst * 10**3 + np.arange(count, dtype=np.int64)


def test_back_to_back_calls_with_jitter(world):
    """alltoallv, allgatherv and neighbor_alltoallv back to back, counts changing every call,
    rank-dependent pauses shuffling who is early; results checked against closed forms (no MPI
    call between them to hold the ranks in step)."""
    p, me = world.size, world.rank
    cart = world.Create_cart([p], periods=[True], reorder=False)
    below, above = cart.Shift(0, 1)
    rng = np.random.default_rng(1234 + me)
    bad = []
    try:
        for i in range(240):
            kind = i % 3
            if kind == 0:
                sc = np.array([(i + me + 2 * d) % 4 for d in range(p)], np.int64)
                rc = np.array([(i + s + 2 * me) % 4 for s in range(p)], np.int64)
                send = np.concatenate([encoded(i, me, d, int(sc[d])) for d in range(p)])
                recv = np.full(int(rc.sum()), -1, np.int64)
                got = zcoll.alltoallv(world, [send, sc], [recv, rc])
                want = np.concatenate([encoded(i, s, me, int(rc[s])) for s in range(p)])
            elif kind == 1:
                counts = np.array([(i + s) % 3 for s in range(p)], np.int64)
                send = encoded(i, me, 0, int(counts[me]))
                recv = np.full(int(counts.sum()), -1, np.int64)
                got = zcoll.allgatherv(world, send, [recv, counts])
                want = np.concatenate([encoded(i, s, 0, int(counts[s])) for s in range(p)])
            else:
                # block 2d + x goes toward direction x; receive slot 0 gets the block `below`
                # sent upward (its slot 1), slot 1 the one `above` sent downward (its slot 0)
                n_me, n_below, n_above = (1 + (i + s) % 3 for s in (me, below, above))
                send = np.concatenate([encoded(i, me, 0, n_me), encoded(i, me, 1, n_me)])
                recv = np.full(n_below + n_above, -1, np.int64)
                got = zcoll.neighbor_alltoallv(cart, [send, [n_me] * 2],
                                               [recv, [n_below, n_above]])  # fmt: skip
                want = np.concatenate([encoded(i, below, 1, n_below),
                                       encoded(i, above, 0, n_above)])  # fmt: skip
            if got is not recv or not np.array_equal(recv, want):
                bad.append((i, ["alltoallv", "allgatherv", "neighbor_alltoallv"][kind]))
            if rng.random() < 0.05:
                time.sleep(rng.random() * 1e-3)
    finally:
        cart.Free()
    all_ranks_agree(world, not bad, f"(call, op) wrong: {bad[:8]}")


# --- the zero-counts-first regression ---------------------------------------------------------


@pytest.mark.parametrize("op", ["alltoallv", "allgatherv"])
def test_zero_counts_first_on_a_fresh_dup(world, op):
    """On a fresh dup, a first call with every count zero, then calls with data, alternating
    (a metadata-parity bug once showed exactly there, at P = 5); 20 rounds, then 40 calls
    alternating on one more dup."""
    p, me = world.size, world.rank
    rng_l = np.random.default_rng([9, me])
    failures = []
    for round_ in range(21):
        dup = world.Dup()
        try:
            for call in range(4 if round_ < 20 else 40):
                zero = call % 2 == 0
                order, copy = ORDERS[(round_ + call) % 5], COPIES[call % 4]
                arena = (round_ + call) % 3 == 0
                base = 1 + (round_ + call) % 4
                if op == "alltoallv":
                    counts = np.zeros((p, p), np.int64)
                    if not zero:
                        counts = base + (np.arange(p)[:, None] + 2 * np.arange(p)[None, :]) % 3
                    sc, rc = counts[me], counts[:, me]
                    sd, ssize = ref.packed_displs(sc), int(sc.sum())
                    rd, rsize = ref.layout(rng_l, rc)
                    send = make(dup, ssize, np.int64, arena)
                    send[:] = me * 1000 + np.arange(ssize)
                    recv = make(dup, rsize, np.int64, not arena)
                    recv[:] = -7
                    expected = recv.copy()
                    ref.mpi_alltoallv(dup, send, sc, sd, expected, rc, rd)
                    _, error = guarded(zcoll.alltoallv, dup, [send, sc], [recv, rc, rd],
                                       order=order, copy=copy)  # fmt: skip
                else:
                    counts = np.zeros(p, np.int64) if zero else base + np.arange(p) % 3
                    rd, rsize = ref.layout(rng_l, counts)
                    send = make(dup, int(counts[me]), np.int64, arena)
                    send[:] = me * 1000 + np.arange(send.size)
                    recv = make(dup, rsize, np.int64, not arena)
                    recv[:] = -7
                    expected = recv.copy()
                    ref.mpi_allgatherv(dup, send, send.size, expected, counts, rd)
                    _, error = guarded(zcoll.allgatherv, dup, send, [recv, (counts, rd)],
                                       order=order, copy=copy)  # fmt: skip
                if error or not ref.same_bits(recv, expected):
                    failures.append((round_, call, "zero" if zero else "data", order, copy,
                                     error or ref.first_difference(recv, expected)))  # fmt: skip
        finally:
            dup.Free()
    all_ranks_agree(world, not failures, f"{op}, (round, call, ...): {failures[:6]}")


# --- neighbourhood collectives ----------------------------------------------------------------

NEIGHBOR_OPS = ["neighbor_alltoall", "neighbor_allgather", "neighbor_alltoallv",
                "neighbor_allgatherv"]  # fmt: skip
NEIGHBOR_DTYPES = [np.uint8, np.float64, np.complex128, np.longdouble, np.bool_, np.int16,
                   np.float16, np.uint32, np.complex64]  # fmt: skip
TOPOLOGIES = sorted(ref.TOPOLOGIES)


@pytest.fixture(scope="module")
def topologies(world):
    """topology(name): the topology communicator (made once per module, collectively; None
    on every rank where it does not fit P, COMM_NULL on ranks outside it)."""
    made: dict = {}

    def get(name):
        if name not in made:
            made[name] = ref.make_topology(world, name)
        return made[name]

    yield get
    for c in made.values():
        if c is not None and c != MPI.COMM_NULL:
            c.Free()


def topology_or_skip(topologies, name):
    comm = topologies(name)
    if comm is None:
        pytest.skip(f"{name} does not fit this number of ranks")
    return comm


def member(comm) -> bool:
    return comm != MPI.COMM_NULL


def neighbor_block_case(comm, rng_g, rng_l, op, dtype, order, copy, send_arena, recv_arena,
                        *, reference="mpi") -> str | None:  # fmt: skip
    """neighbor_alltoall or neighbor_allgather with a seeded block shape and buffer layout
    (2-D/3-D or flat, recvbuf given or None) against mpi4py (explicit counts) or the
    point-to-point reference."""
    indeg, outdeg = ref.degrees(comm)
    inner = [(), (1,), (3,), (17,), (2, 5), (0,), (300,)][int(rng_g.integers(0, 7))]
    flat = bool(rng_g.random() < 0.3)
    new = bool(rng_g.random() < 0.3)
    if op == "neighbor_alltoall":
        if not inner:
            inner = (4,)
        block = int(np.prod(inner))
        if flat and new and outdeg == 0:
            flat = False  # a flat empty sendbuf cannot tell the block size of the result
        sshape = (outdeg * block,) if flat else (outdeg, *inner)
        rshape = (indeg * block,) if flat else (indeg, *inner)
    else:
        sshape = inner or (5,)
        block = int(np.prod(sshape))
        rshape = (indeg * block,) if flat else (indeg, *sshape)
    send = make(comm, sshape, dtype, send_arena)
    ref.random_fill(send, rng_l)
    what = (f"{op} {np.dtype(dtype).name} send{sshape} recv{'None' if new else rshape} "
            f"order={order} copy={copy}")  # fmt: skip
    recv = None if new else make(comm, rshape, dtype, recv_arena)
    expected = np.empty(rshape, dtype)
    ref.random_fill(expected, rng_l)
    if recv is not None:
        ref.as_bytes(recv)[:] = ref.as_bytes(expected)
    if op == "neighbor_alltoall":
        fn = ref.neighbor_reference("alltoall", reference)
        fn(comm, send, expected, block)
        call = zcoll.neighbor_alltoall
    else:
        fn = ref.neighbor_reference("allgather", reference)
        fn(comm, send, expected)
        call = zcoll.neighbor_allgather
    got, error = guarded(call, comm, send, recv, order=order, copy=copy)
    if error:
        return f"{what}: {error}"
    if recv is not None:
        if got is not recv:
            return f"{what}: did not return recvbuf"
        if not ref.same_bits(recv, expected):
            return f"{what}: {ref.first_difference(recv, expected)}"
        return None
    if op == "neighbor_alltoall":
        want_shape = (indeg * block,) if flat else (indeg, *inner)
    else:
        want_shape = (indeg, *sshape)
    if not isinstance(got, np.ndarray) or got.shape != want_shape or got.dtype != np.dtype(dtype):
        return f"{what}: result {getattr(got, 'shape', got)}, want {want_shape}"
    if not zcoll.is_shared(got):
        return f"{what}: the result is not an arena array"
    # slots of PROC_NULL neighbours are undefined in a new array: compare the others
    live = ref.live_slots(comm)
    g = got.reshape(indeg, -1) if indeg else got
    e = expected.reshape(indeg, -1) if indeg else expected
    if indeg and not ref.same_bits(g[live], e[live]):
        return f"{what}: {ref.first_difference(g[live], e[live])}"
    return None


def neighbor_v_case(comm, rng_g, rng_l, op, dtype, order, copy, send_arena, recv_arena,
                    *, reference="mpi", forms=None) -> str | None:  # fmt: skip
    """neighbor_alltoallv or neighbor_allgatherv with seeded per-edge counts and layouts."""
    indeg, outdeg = ref.degrees(comm)
    recv_form = forms[1] if forms else str(rng_g.choice(POOL_FORMS))
    uniform = recv_form in UNIFORM_FORMS
    if op == "neighbor_alltoallv":
        send_form = forms[0] if forms else str(rng_g.choice(POOL_FORMS))
        uniform |= send_form in UNIFORM_FORMS
        if uniform:
            c = int(rng_g.choice([0, 1, 6]))
            scounts, rcounts = np.full(outdeg, c, np.int64), np.full(indeg, c, np.int64)
        else:
            scounts, rcounts = ref.edge_counts(comm, rng_g, rng_l)
        sdispls, ssize = side_layout(send_form, rng_l, scounts, send=True)
    else:
        send_form = str(rng_g.choice(SEND_FORMS))
        sizes = np.full(comm.size, int(rng_g.choice([0, 1, 6])), np.int64)
        if not uniform:
            sizes = rng_g.integers(0, 13, comm.size).astype(np.int64)
            sizes[rng_g.random(comm.size) < 0.25] = 0
        sources = ref.neighbour_lists(comm)[0]
        rcounts = np.array([sizes[s] if s != MPI.PROC_NULL else sizes[comm.rank]
                            for s in sources], np.int64)  # fmt: skip
        spare = 0 if send_form == "array" else int(rng_l.integers(0, 3))
        ssize = int(sizes[comm.rank]) + spare
    rdispls, rsize = side_layout(recv_form, rng_l, rcounts, send=False)
    send = make(comm, shaped(rng_l, ssize), dtype, send_arena)
    recv = make(comm, shaped(rng_l, rsize), dtype, recv_arena)
    ref.random_fill(send, rng_l)
    ref.random_fill(recv, rng_l)
    expected = recv.copy()
    what = f"{op} {np.dtype(dtype).name} forms={send_form}/{recv_form} order={order} copy={copy}"
    if op == "neighbor_alltoallv":
        fn = ref.neighbor_reference("alltoallv", reference)
        fn(comm, send, scounts, sdispls, expected, rcounts, rdispls)
        sendspec = vspec(send_form, send, scounts, sdispls)
        call = zcoll.neighbor_alltoallv
    else:
        count = int(sizes[comm.rank])
        fn = ref.neighbor_reference("allgatherv", reference)
        fn(comm, send, count, expected, rcounts, rdispls)
        datatype = ref.mpi_datatype(dtype)
        sendspec = (send if send_form == "array" else
                    [send, count] if send_form == "count" or datatype is None else
                    [send, count, datatype])  # fmt: skip
        call = zcoll.neighbor_allgatherv
    recvspec = vspec(recv_form, recv, rcounts, rdispls)
    got, error = guarded(call, comm, sendspec, recvspec, order=order, copy=copy)
    if error:
        return f"{what}: {error}"
    if got is not recv:
        return f"{what}: did not return recvbuf's array"
    if not ref.same_bits(recv, expected):
        return f"{what}: {ref.first_difference(recv, expected)}"
    return None


def neighbor_case(comm, rng_g, rng_l, op, *args, **kwargs) -> str | None:
    runner = neighbor_block_case if op in NEIGHBOR_OPS[:2] else neighbor_v_case
    return runner(comm, rng_g, rng_l, op, *args, **kwargs)


REPEATING = ["cart_two_periodic", "cart_unit_dims", "graph_repeated_ring", "graph_classic"]


def repeated_source_case(comm, rng_l, op: str, n: int) -> str | None:
    """neighbor_allgather(v) or neighbor_alltoall of plain float64 arrays, blocks of about `n`
    elements (allgatherv: n + 7 * the sender's rank), against MPI or point-to-point."""
    indeg, outdeg = ref.degrees(comm)
    if op == "neighbor_alltoall":
        send, recv = np.empty((outdeg, n)), np.empty((indeg, n))
    elif op == "neighbor_allgather":
        send, recv = np.empty(n), np.empty((indeg, n))
    else:
        sources = ref.neighbour_lists(comm)[0]
        rcounts = np.array([n + 7 * (comm.rank if s == MPI.PROC_NULL else s) for s in sources])
        rdispls, rsize = ref.layout(rng_l, rcounts)
        send, recv = np.empty(n + 7 * comm.rank), np.empty(rsize)
    ref.random_fill(send, rng_l)
    ref.random_fill(recv, rng_l)
    expected = recv.copy()
    if op == "neighbor_alltoall":
        ref.neighbor_reference("alltoall")(comm, send, expected, n)
        _, error = guarded(zcoll.neighbor_alltoall, comm, send, recv)
    elif op == "neighbor_allgather":
        ref.neighbor_reference("allgather")(comm, send, expected)
        _, error = guarded(zcoll.neighbor_allgather, comm, send, recv)
    else:
        ref.neighbor_reference("allgatherv")(comm, send, send.size, expected, rcounts, rdispls)
        _, error = guarded(zcoll.neighbor_allgatherv, comm, send, [recv, (rcounts, rdispls)])
    if error or not ref.same_bits(recv, expected):
        return f"{op} n={n}: {error or ref.first_difference(recv, expected)}"
    return None


@pytest.mark.parametrize("op", ["neighbor_allgather", "neighbor_allgatherv", "neighbor_alltoall"])
@pytest.mark.parametrize("topo", REPEATING)
def test_repeated_sources_pulled_by_cma(world, topologies, topo, op):
    """Neighbours listed more than once (a periodic dimension of 2 or 1, a graph's repeated
    edges) on plain arrays pulled by CMA (cma_bytes 0): the gathers read a repeated source's
    block across processes once and copy it into its other slots (vexchange.cpp), the
    alltoall reads each block; blocks of 5000 elements and of 7."""
    comm = topology_or_skip(topologies, topo)
    failures = []
    if member(comm):
        core = _context.context(comm).core
        before = core.cma_bytes
        core.cma_bytes = 0
        try:
            rng_l = np.random.default_rng([31, REPEATING.index(topo), comm.rank])
            for n in (5000, 7, 5000):
                failures.append(repeated_source_case(comm, rng_l, op, n))
        finally:
            core.cma_bytes = before
    failures = [f for f in failures if f]
    all_ranks_agree(world, not failures, f"{topo} {op}: {failures}")


@pytest.mark.parametrize("op", NEIGHBOR_OPS)
@pytest.mark.parametrize("topo", TOPOLOGIES)
def test_neighbor_matches_mpi(world, topologies, topo, op):
    """Each topology and neighbourhood collective: dtype families, block shapes, every order and
    copy mode, arena/private/mixed buffers, against mpi4py's blocking collective."""
    comm = topology_or_skip(topologies, topo)
    failures = []
    if member(comm):
        rng_g, rng_l = seeded_rngs(comm, [10, TOPOLOGIES.index(topo), NEIGHBOR_OPS.index(op)])
        for case, dtype in enumerate(NEIGHBOR_DTYPES):
            send_arena, recv_arena = arena_pair(MODES[case % 3], case // 3)
            failure = neighbor_case(comm, rng_g, rng_l, op, dtype, ORDERS[case % 5],
                                    COPIES[case % 4], send_arena, recv_arena)  # fmt: skip
            if failure:
                failures.append(failure)
    all_ranks_agree(world, not failures, f"{topo} {op}: {failures}")


@pytest.mark.parametrize("path", PRIVATE_PATHS)
@pytest.mark.parametrize("topo", ["cart2d_mixed", "graph_repeated_ring"])
def test_neighbor_private_buffers(world, topologies, topo, path):
    """Every neighbourhood collective on plain NumPy buffers pulled by CMA or staged."""
    comm = topology_or_skip(topologies, topo)
    failures = []
    if member(comm):
        rng_g, rng_l = seeded_rngs(comm, [11, TOPOLOGIES.index(topo), PRIVATE_PATHS.index(path)])
        with private_buffers_by(comm, path):
            for case, dtype in enumerate(NEIGHBOR_DTYPES):
                op = NEIGHBOR_OPS[case % 4]
                send_arena, recv_arena = arena_pair(MODES[1 + case % 2], case // 2)
                failure = neighbor_case(comm, rng_g, rng_l, op, dtype, "auto", "auto",
                                        send_arena, recv_arena)  # fmt: skip
                if failure:
                    failures.append(f"{op}: {failure}")
    all_ranks_agree(world, not failures, f"{topo} {path}: {failures}")


@pytest.mark.parametrize("topo", ["cart2d_mixed", "graph_adjacent"])
def test_neighbor_v_strided_specification(world, topologies, topo):
    """mpi4py's integer forms on neighbor_alltoallv/allgatherv: ``[a, (count, stride)]`` is
    count elements per neighbour, block i at i * stride."""
    comm = topology_or_skip(topologies, topo)
    failures = []
    if member(comm):
        rng_g = np.random.default_rng([15, TOPOLOGIES.index(topo)])
        rng_l = np.random.default_rng([15, TOPOLOGIES.index(topo), comm.rank])
        for case, forms in enumerate([("strided", "tuple"), ("four", "strided"),
                                      ("strided", "strided")]):  # fmt: skip
            for op in ("neighbor_alltoallv", "neighbor_allgatherv"):
                failure = neighbor_v_case(comm, rng_g, rng_l, op, np.float64, ORDERS[case],
                                          "auto", case == 0, case == 1, forms=forms)  # fmt: skip
                if failure:
                    failures.append(failure)
    all_ranks_agree(world, not failures, f"{topo} strided: {failures}")


@pytest.mark.parametrize("topo", TOPOLOGIES)
def test_p2p_reference_matches_mpi(world, topologies, topo):
    """The point-to-point reference (vcoll_reference.py) agrees with mpi4py's blocking
    neighbourhood collectives, explicit counts, on every topology used here (no zcoll).
    Skipped where this MPI's own do not follow the standard (vcoll_reference.py: MPICH): the
    tests then compare zcoll with the point-to-point reference."""
    if not ref.neighbourhood_follows_standard():
        pytest.skip(
            f"{MPI.Get_library_version().splitlines()[0]}: its neighbourhood "
            "collectives break MPI-4.1's send/receive matching (vcoll_reference.py)"
        )
    comm = topology_or_skip(topologies, topo)
    failures = []
    if member(comm):
        rng_g = np.random.default_rng([11, TOPOLOGIES.index(topo)])
        rng_l = np.random.default_rng([11, TOPOLOGIES.index(topo), comm.rank])
        indeg, outdeg = ref.degrees(comm)
        for dtype in (np.uint8, np.float64):
            for block in (1, 7):
                send = np.empty((outdeg, block), dtype)
                ref.random_fill(send, rng_l)
                a = np.empty((indeg, block), dtype)
                ref.random_fill(a, rng_l)
                b = a.copy()
                ref.mpi_neighbor_alltoall(comm, send, a, block)
                ref.p2p_neighbor_alltoall(comm, send, b, block)
                if not ref.same_bits(a, b):
                    failures.append(("alltoall", block, ref.first_difference(b, a)))
                mine = send.reshape(-1)[:block].copy() if send.size else np.zeros(block, dtype)
                a = np.empty((indeg, block), dtype)
                ref.random_fill(a, rng_l)
                b = a.copy()
                ref.mpi_neighbor_allgather(comm, mine, a)
                ref.p2p_neighbor_allgather(comm, mine, b)
                if not ref.same_bits(a, b):
                    failures.append(("allgather", block, ref.first_difference(b, a)))
            scounts, rcounts = ref.edge_counts(comm, rng_g, rng_l)
            sdispls, ssize = ref.layout(rng_l, scounts, overlap=True)
            rdispls, rsize = ref.layout(rng_l, rcounts)
            send = np.empty(ssize, dtype)
            ref.random_fill(send, rng_l)
            a = np.empty(rsize, dtype)
            ref.random_fill(a, rng_l)
            b = a.copy()
            ref.mpi_neighbor_alltoallv(comm, send, scounts, sdispls, a, rcounts, rdispls)
            ref.p2p_neighbor_alltoallv(comm, send, scounts, sdispls, b, rcounts, rdispls)
            if not ref.same_bits(a, b):
                failures.append(("alltoallv", ref.first_difference(b, a)))
            sizes = rng_g.integers(0, 9, comm.size)
            sources = ref.neighbour_lists(comm)[0]
            rcounts = [int(sizes[s]) if s != MPI.PROC_NULL else 3 for s in sources]
            rdispls, rsize = ref.layout(rng_l, rcounts)
            send = np.empty(int(sizes[comm.rank]), dtype)
            ref.random_fill(send, rng_l)
            a = np.empty(rsize, dtype)
            ref.random_fill(a, rng_l)
            b = a.copy()
            ref.mpi_neighbor_allgatherv(comm, send, send.size, a, rcounts, rdispls)
            ref.p2p_neighbor_allgatherv(comm, send, send.size, b, rcounts, rdispls)
            if not ref.same_bits(a, b):
                failures.append(("allgatherv", ref.first_difference(b, a)))
    all_ranks_agree(world, not failures, f"{topo}: reference != mpi4py: {failures}")


def test_p2p_reference_follows_mpi_4_1_on_a_periodic_dimension_of_two(world, topologies):
    """The reference's Cartesian rule written out: on a periodic dimension of 2 the block a
    neighbour sends in the positive direction (its slot 2d + 1) lands in the negative slot 2d."""
    comm = topology_or_skip(topologies, "cart_two_periodic")
    ok = True
    if member(comm):
        n = 2 * comm.Get_dim()
        send = (100 * comm.rank + np.arange(n)).astype(np.int32).reshape(n, 1)
        got = np.full((n, 1), -1, np.int32)
        ref.p2p_neighbor_alltoall(comm, send, got, 1)
        want = []
        for d in range(comm.Get_dim()):
            below, above = comm.Shift(d, 1)
            want += [100 * below + 2 * d + 1, 100 * above + 2 * d]
        ok = got.reshape(-1).tolist() == want
    all_ranks_agree(world, ok, "cart_two_periodic: reference slots")


@pytest.mark.parametrize("op", NEIGHBOR_OPS)
@pytest.mark.parametrize("topo", ["graph_adjacent", "graph_adjacent_weighted", "graph_general"])
def test_neighbor_user_buffers_on_degree_zero_ranks(world, topologies, topo, op):
    """Plain arrays, as a user passes them to comm.Neighbor_alltoall(send, recv): on ranks of
    in- or out-degree 0 mpi4py then infers differing counts there and Open MPI 4.1 fails with
    MPI_ERR_TRUNCATE or hangs (open-mpi/ompi#14452, see vcoll_reference.py), so these are
    judged by the point-to-point reference."""
    comm = topology_or_skip(topologies, topo)
    failures = []
    if member(comm):
        indeg, outdeg = ref.degrees(comm)
        seed = [12, TOPOLOGIES.index(topo), NEIGHBOR_OPS.index(op)]
        rng_l = np.random.default_rng([*seed, comm.rank])
        for case, (dtype, block) in enumerate([(np.float64, 3), (np.int8, 1), (np.complex64, 8)]):
            order, copy = ORDERS[case], COPIES[case]
            expected = np.empty(indeg * block, dtype)
            ref.random_fill(expected, rng_l)
            recv = expected.copy().reshape(indeg, block)
            if op == "neighbor_alltoall":
                send = np.empty((outdeg, block), dtype)
                ref.random_fill(send, rng_l)
                ref.p2p_neighbor_alltoall(comm, send, expected, block)
            elif op == "neighbor_allgather":
                send = np.empty(block, dtype)
                ref.random_fill(send, rng_l)
                ref.p2p_neighbor_allgather(comm, send, expected)
            elif op == "neighbor_alltoallv":  # plain arrays: split evenly
                send = np.empty(outdeg * block, dtype)
                ref.random_fill(send, rng_l)
                ref.p2p_neighbor_alltoall(comm, send, expected, block)
                recv = recv.reshape(-1)
            else:
                send = np.empty(block, dtype)
                ref.random_fill(send, rng_l)
                ref.p2p_neighbor_allgather(comm, send, expected)
                recv = recv.reshape(-1)
            _, error = guarded(getattr(zcoll, op), comm, send, recv, order=order, copy=copy)
            flat = recv.reshape(-1)
            if error or not ref.same_bits(flat, expected):
                failures.append((np.dtype(dtype).name, block, (indeg, outdeg),
                                 error or ref.first_difference(flat, expected)))  # fmt: skip
    all_ranks_agree(world, not failures, f"{topo} {op} with plain arrays: {failures}")


def test_neighbor_topology_after_other_calls(world, topologies):
    """One topology communicator used by all four neighbourhood collectives and by alltoallv
    (the dense pattern beside the topology's) in turn, twice."""
    comm = topology_or_skip(topologies, "graph_adjacent")
    failures = []
    if member(comm):
        rng_g = np.random.default_rng(13)
        rng_l = np.random.default_rng([13, comm.rank])
        for case in range(10):
            dtype = NEIGHBOR_DTYPES[case % len(NEIGHBOR_DTYPES)]
            if case % 5 == 4:
                failure = alltoallv_case(comm, rng_g, rng_l, dtype, "auto", "auto", True, False)
            else:
                failure = neighbor_case(comm, rng_g, rng_l, NEIGHBOR_OPS[case % 5], dtype,
                                        ORDERS[case % 5], "auto", case % 2 == 0, True)  # fmt: skip
            if failure:
                failures.append(failure)
    all_ranks_agree(world, not failures, f"interleaved: {failures}")


def test_neighbor_zero_counts_first_on_a_fresh_topology(world):
    """The zero-counts-first sequence of test_zero_counts_first_on_a_fresh_dup, on fresh
    Cartesian communicators (neighbor_alltoallv)."""
    failures = []
    for round_ in range(6):
        cart = world.Create_cart([world.size], periods=[round_ % 2 == 0], reorder=False)
        try:
            indeg, outdeg = ref.degrees(cart)
            for call in range(4):
                c = 0 if call % 2 == 0 else 1 + call
                send = np.arange(outdeg * c, dtype=np.int64) + 1000 * world.rank
                recv = np.full(indeg * c + 3, -7, np.int64)
                rd = np.arange(indeg) * c + 1 if indeg else np.zeros(0, np.int64)
                expected = recv.copy()
                ref.neighbor_reference("alltoallv")(cart, send, [c] * outdeg,
                                                    np.arange(outdeg) * c, expected,
                                                    [c] * indeg, rd)  # fmt: skip
                _, error = guarded(zcoll.neighbor_alltoallv, cart, [send, [c] * outdeg],
                                   [recv, [c] * indeg, rd], order=ORDERS[call],
                                   copy=COPIES[call])  # fmt: skip
                if error or not ref.same_bits(recv, expected):
                    failures.append((round_, call, error or ref.first_difference(recv, expected)))
        finally:
            cart.Free()
    all_ranks_agree(world, not failures, f"(round, call, ...): {failures}")


# --- bad input on one rank --------------------------------------------------------------------


def outcome(fn) -> tuple[str, str]:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - any exception is reported; the type is checked
        return type(exc).__name__, str(exc)
    return "ok", ""


def last(comm) -> bool:
    return comm.rank == comm.size - 1


def still_works(comm, topology: bool = False) -> None:
    """A correct call right after the error: alltoallv (and neighbor_alltoallv on a topology)
    against mpi4py."""
    rng_g = np.random.default_rng(4242)
    rng_l = np.random.default_rng([4242, comm.rank])
    failure = alltoallv_case(comm, rng_g, rng_l, np.int32, "auto", "auto", False, True,
                             forms=("four", "tuple"))  # fmt: skip
    if topology and not failure:
        failure = neighbor_v_case(comm, rng_g, rng_l, "neighbor_alltoallv", np.float32, "morton",
                                  "auto", True, False)  # fmt: skip
    all_ranks_agree(comm, failure is None, f"the call after the error: {failure}")


def expect_everywhere(comm, fn, expected: tuple[type, ...], untouched=(), topology=False) -> None:
    """fn() raises one of `expected` on every rank, the same type everywhere (a rank that does
    not raise fails the test: the ranks compare outcomes after the call); the arrays in
    `untouched` (array, copy before) are unchanged; the communicator works afterwards."""
    kind, message = outcome(fn)
    kinds = comm.allgather(kind)
    names = {e.__name__ for e in expected}
    ok = kind in names and len(set(kinds)) == 1
    all_ranks_agree(comm, ok, f"want one of {sorted(names)} on every rank, got {kinds}; "
                              f"here: {kind}: {message}")  # fmt: skip
    changed = [i for i, (a, before) in enumerate(untouched) if not ref.same_bits(a, before)]
    all_ranks_agree(comm, not changed, f"receive buffers written though the call failed: {changed}")
    still_works(comm, topology)


def dense_args(comm, dtype=np.float64):
    """A valid alltoallv: (send, scounts, sdispls, recv, rcounts, rdispls), counts 1..3, a hole
    at the front of both buffers and a spare element at the end."""
    p, me = comm.size, comm.rank
    counts = 1 + (np.arange(p)[:, None] + 2 * np.arange(p)[None, :]) % 3
    sc, rc = counts[me].astype(np.int64), counts[:, me].astype(np.int64)
    sd, rd = ref.packed_displs(sc) + 1, ref.packed_displs(rc) + 1
    send = np.arange(int(sc.sum()) + 2, dtype=np.float64).astype(dtype) + me
    recv = np.full(int(rc.sum()) + 2, -1, dtype)
    return send, sc, sd, recv, rc, rd


ALLTOALLV_BAD = [
    "counts_disagree", "send_count_out_of_bounds", "recv_displ_out_of_bounds",
    "negative_send_count", "negative_recv_count", "negative_send_displ", "negative_recv_displ",
    "too_many_counts", "too_few_counts", "overlapping_recv_blocks", "read_only_recvbuf",
    "non_contiguous_recvbuf", "recvbuf_not_an_array", "send_recv_dtypes_differ",
    "datatype_mismatch", "dtypes_differ_between_ranks", "in_place_on_one_rank",
    "unknown_order", "unknown_copy", "orders_differ",
]  # fmt: skip
TYPE_ERRORS = {"recvbuf_not_an_array", "send_recv_dtypes_differ", "datatype_mismatch",
               "dtypes_differ_between_ranks"}  # fmt: skip
NEEDS_TWO = {"overlapping_recv_blocks", "dtypes_differ_between_ranks", "in_place_on_one_rank",
             "orders_differ"}  # fmt: skip


@pytest.mark.parametrize("bad", ALLTOALLV_BAD)
def test_alltoallv_bad_input_on_one_rank(world, bad):
    if world.size == 1 and bad in NEEDS_TWO:
        pytest.skip("needs two ranks")
    send, sc, sd, recv, rc, rd = dense_args(world)
    order, copy = "auto", "auto"
    sendspec = [send, sc, sd, MPI.DOUBLE]
    recvspec = [recv, (rc, rd)]
    untouched = [(recv, recv.copy())]
    if last(world):
        if bad == "counts_disagree":
            sc = sc.copy()
            sc[0] += 1
            sendspec = [send, sc, sd, MPI.DOUBLE]
        elif bad == "send_count_out_of_bounds":
            sendspec = [send[: int(sc.sum())], sc, sd, MPI.DOUBLE]  # the last block ends past it
        elif bad == "recv_displ_out_of_bounds":
            rd = rd.copy()
            rd[-1] = recv.size - int(rc[-1]) + 1
            recvspec = [recv, (rc, rd)]
        elif bad == "negative_send_count":
            sendspec = [send, np.r_[-1, sc[1:]], sd, MPI.DOUBLE]
        elif bad == "negative_recv_count":
            recvspec = [recv, (np.r_[-1, rc[1:]], rd)]
        elif bad == "negative_send_displ":
            sendspec = [send, sc, np.r_[-1, sd[1:]], MPI.DOUBLE]
        elif bad == "negative_recv_displ":
            recvspec = [recv, (rc, np.r_[-1, rd[1:]])]
        elif bad == "too_many_counts":
            sendspec = [send, np.r_[sc, 0], np.r_[sd, 0], MPI.DOUBLE]
        elif bad == "too_few_counts":
            recvspec = [recv, (rc[:-1], rd[:-1])]
        elif bad == "overlapping_recv_blocks":
            rd = rd.copy()
            rd[1] = rd[0]
            recvspec = [recv, (rc, rd)]
        elif bad == "read_only_recvbuf":
            recv.flags.writeable = False
        elif bad == "non_contiguous_recvbuf":
            wide = np.full(2 * recv.size, -1.0)
            untouched = [(wide, wide.copy())]
            recvspec = [wide[::2], (rc, rd)]
        elif bad == "recvbuf_not_an_array":
            recvspec = [recv.tolist(), (rc, rd)]
        elif bad == "send_recv_dtypes_differ":
            other = np.full(recv.size, -1, np.float32)
            untouched = [(other, other.copy())]
            recvspec = [other, (rc, rd)]
        elif bad == "datatype_mismatch":
            sendspec = [send, sc, sd, MPI.FLOAT]
        elif bad == "dtypes_differ_between_ranks":
            send = send.astype(np.int64)
            other = np.full(recv.size, -1, np.int64)
            untouched = [(other, other.copy())]
            sendspec, recvspec = [send, sc, sd], [other, (rc, rd)]
        elif bad == "in_place_on_one_rank":
            sendspec = zcoll.IN_PLACE
        elif bad == "unknown_order":
            order = "zigzag"
        elif bad == "unknown_copy":
            copy = "fast"
        elif bad == "orders_differ":
            order = "hilbert"
    if bad == "orders_differ" and not last(world):
        order = "morton"
    want = (TypeError,) if bad in TYPE_ERRORS else (ValueError,)
    if bad == "recvbuf_not_an_array":
        want = (TypeError, ValueError)
    expect_everywhere(world, lambda: zcoll.alltoallv(world, sendspec, recvspec, order=order,
                                                     copy=copy), want, untouched)  # fmt: skip


ALLGATHERV_BAD = [
    "send_count_disagrees", "recv_count_disagrees", "send_count_past_array",
    "recv_displ_out_of_bounds", "negative_recv_count", "negative_recv_displ",
    "wrong_number_of_counts", "overlapping_recv_blocks", "read_only_recvbuf",
    "non_contiguous_recvbuf", "send_recv_dtypes_differ", "datatype_mismatch",
    "new_recvbuf_bad_send_count", "new_recvbuf_in_place", "unknown_order",
]  # fmt: skip


@pytest.mark.parametrize("bad", ALLGATHERV_BAD)
def test_allgatherv_bad_input_on_one_rank(world, bad):
    if world.size == 1 and bad == "overlapping_recv_blocks":
        pytest.skip("needs two ranks")
    p, me = world.size, world.rank
    counts = (1 + np.arange(p) % 3).astype(np.int64)
    rd = ref.packed_displs(counts) + 2
    recv = np.full(int(counts.sum()) + 3, -1.0)
    send = np.arange(int(counts[me]) + 1, dtype=np.float64) + me
    sendspec, recvspec = [send, int(counts[me])], [recv, (counts, rd)]
    untouched = [(recv, recv.copy())]
    order = "auto"
    new = bad.startswith("new_recvbuf")
    if last(world):
        if bad == "send_count_disagrees":
            sendspec = [send, int(counts[me]) + 1]
        elif bad == "recv_count_disagrees":
            recvspec = [recv, (np.r_[counts[0] + 1, counts[1:]], rd)]
        elif bad == "send_count_past_array":
            sendspec = [send, send.size + 1]
        elif bad == "recv_displ_out_of_bounds":
            recvspec = [recv, (counts, np.r_[rd[:-1], recv.size])]
        elif bad == "negative_recv_count":
            recvspec = [recv, (np.r_[-1, counts[1:]], rd)]
        elif bad == "negative_recv_displ":
            recvspec = [recv, (counts, np.r_[-1, rd[1:]])]
        elif bad == "wrong_number_of_counts":
            recvspec = [recv, (np.r_[counts, 1], np.r_[rd, 0])]
        elif bad == "overlapping_recv_blocks":
            recvspec = [recv, (counts, np.r_[rd[0], rd[0], rd[2:]])]
        elif bad == "read_only_recvbuf":
            recv.flags.writeable = False
        elif bad == "non_contiguous_recvbuf":
            wide = np.full(2 * recv.size, -1.0)
            untouched = [(wide, wide.copy())]
            recvspec = [wide[::2], (counts, rd)]
        elif bad == "send_recv_dtypes_differ":
            other = np.full(recv.size, -1, np.float32)
            untouched = [(other, other.copy())]
            recvspec = [other, (counts, rd)]
        elif bad == "datatype_mismatch":
            sendspec = [send, int(counts[me]), MPI.INT64_T]
        elif bad == "new_recvbuf_bad_send_count":
            sendspec = [send, send.size + 5]
        elif bad == "new_recvbuf_in_place":
            sendspec = zcoll.IN_PLACE
        elif bad == "unknown_order":
            order = "zigzag"
    want = (TypeError,) if bad in ("send_recv_dtypes_differ", "datatype_mismatch") else (
        ValueError,)  # fmt: skip
    if new:
        expect_everywhere(world, lambda: zcoll.allgatherv(world, sendspec, order=order), want)
    else:
        expect_everywhere(world, lambda: zcoll.allgatherv(world, sendspec, recvspec, order=order),
                          want, untouched)  # fmt: skip


@pytest.mark.parametrize("op", NEIGHBOR_OPS)
def test_neighbor_call_without_topology_raises_everywhere(world, op):
    dup = world.Dup()
    try:
        send = np.zeros((2, 3))
        recv = np.full((2, 3), -1.0)
        args = {
            "neighbor_alltoall": (send, recv),
            "neighbor_allgather": (send[0], recv),
            "neighbor_alltoallv": ([send, [3, 3]], [recv, [3, 3]]),
            "neighbor_allgatherv": (send[0], [recv, [3, 3]]),
        }[op]
        fn = getattr(zcoll, op)
        expect_everywhere(dup, lambda: fn(dup, *args), (ValueError,), [(recv, recv.copy())])
    finally:
        dup.Free()


@pytest.mark.parametrize("op", NEIGHBOR_OPS)
def test_neighbor_in_place_is_rejected_everywhere(world, topologies, op):
    """MPI has no in-place neighbourhood collectives: IN_PLACE as sendbuf is an error on every
    rank, also where it could pass for an empty buffer (np.asarray(MPI.IN_PLACE) is an empty
    uint8 array) next to an empty uint8 recvbuf."""
    comm = topology_or_skip(topologies, "cart1d_periodic")
    recv = np.zeros(0, np.uint8)
    spec = recv if op in ("neighbor_alltoall", "neighbor_allgather") else [recv, [0, 0]]
    fn = getattr(zcoll, op)
    expect_everywhere(comm, lambda: fn(comm, zcoll.IN_PLACE, spec), (TypeError, ValueError))


NEIGHBOR_BAD = [
    "alltoall_first_axis_not_outdegree", "alltoall_block_sizes_differ",
    "alltoall_recv_size_wrong", "alltoallv_counts_disagree", "alltoallv_wrong_number_of_counts",
    "alltoallv_recv_displ_out_of_bounds", "alltoallv_overlapping_recv_blocks",
    "allgatherv_recv_count_disagrees", "allgather_read_only_recvbuf",
    "allgather_send_recv_dtypes_differ", "alltoallv_datatype_mismatch", "alltoall_in_place",
    "alltoall_unknown_order",
]  # fmt: skip


@pytest.mark.parametrize("topo", ["cart1d_periodic", "graph_repeated_ring"])
@pytest.mark.parametrize("bad", NEIGHBOR_BAD)
def test_neighbor_bad_input_on_one_rank(world, topologies, topo, bad):
    """Bad neighbourhood arguments on the last rank, on topologies where every rank has in-
    and out-edges (the last rank's blocks reach someone)."""
    comm = topology_or_skip(topologies, topo)
    if bad == "alltoallv_overlapping_recv_blocks" and ref.degrees(comm)[0] < 2:
        pytest.skip("needs two receive blocks")
    if bad == "alltoall_block_sizes_differ" and comm.size == 1:
        pytest.skip("a rank that is its only neighbour always agrees with itself")
    indeg, outdeg = ref.degrees(comm)
    b = 2
    send = np.arange(outdeg * b, dtype=np.float64).reshape(outdeg, b) + 100 * comm.rank
    recv = np.full((indeg, b), -1.0)
    untouched = [(recv, recv.copy())]
    order = "auto"
    fn = zcoll.neighbor_alltoall
    args: tuple = (send, recv)
    if bad.startswith("alltoallv"):
        fn = zcoll.neighbor_alltoallv
        args = ([send, [b] * outdeg], [recv, ([b] * indeg, list(np.arange(indeg) * b))])
    elif bad.startswith("allgatherv"):
        fn = zcoll.neighbor_allgatherv
        args = (send[0], [recv, [b] * indeg])
    elif bad.startswith("allgather"):
        fn = zcoll.neighbor_allgather
        args = (send[0], recv)
    if last(comm):
        if bad == "alltoall_first_axis_not_outdegree":
            args = (np.zeros((outdeg + 1, b)), recv)
        elif bad == "alltoall_block_sizes_differ":
            wide = np.full((indeg, b + 1), -1.0)
            untouched = [(wide, wide.copy())]
            args = (np.zeros((outdeg, b + 1)), wide)
        elif bad == "alltoall_recv_size_wrong":
            big = np.full((indeg + 1, b), -1.0)
            untouched = [(big, big.copy())]
            args = (send, big)
        elif bad == "alltoallv_counts_disagree":
            args = ([np.zeros(outdeg * b + 1), [b + 1] + [b] * (outdeg - 1)], args[1])
        elif bad == "alltoallv_wrong_number_of_counts":
            args = ([send, [b] * (outdeg + 1), list(np.arange(outdeg + 1) * 0)], args[1])
        elif bad == "alltoallv_recv_displ_out_of_bounds":
            args = (args[0], [recv, ([b] * indeg, [recv.size - b + 1] * indeg)])
        elif bad == "alltoallv_overlapping_recv_blocks":
            args = (args[0], [recv, ([b] * indeg, [0] * indeg)])
        elif bad == "allgatherv_recv_count_disagrees":
            args = (send[0], [recv, [b + 1] + [b] * (indeg - 1)])
        elif bad == "allgather_read_only_recvbuf":
            recv.flags.writeable = False
        elif bad == "allgather_send_recv_dtypes_differ":
            other = np.full((indeg, b), -1, np.float32)
            untouched = [(other, other.copy())]
            args = (send[0], other)
        elif bad == "alltoallv_datatype_mismatch":
            args = ([send, [b] * outdeg, list(np.arange(outdeg) * b), MPI.FLOAT], args[1])
        elif bad == "alltoall_in_place":
            args = (zcoll.IN_PLACE, recv)
        elif bad == "alltoall_unknown_order":
            order = "zigzag"
    if bad in ("allgather_send_recv_dtypes_differ", "alltoallv_datatype_mismatch"):
        want: tuple = (TypeError,)
    elif bad == "alltoall_in_place":  # MPI has no in-place neighbourhood collectives
        want = (TypeError, ValueError)
    else:
        want = (ValueError,)
    expect_everywhere(comm, lambda: fn(comm, *args, order=order), want, untouched, topology=True)


# --- persistent irregular calls -------------------------------------------------------------

V_PLANS = ["alltoallv", "alltoallv in place", "allgatherv", "allgatherv in place",
           "neighbor_alltoallv"]  # fmt: skip


def _plan_buffers(comm, rng_g, rng_l, case: str, dtype, arena: bool):
    """(send spec or IN_PLACE, receive spec, the array whose blocks are sent, reference(send,
    recv) that runs mpi4py's call or the point-to-point reference on copies): a seeded call of
    `case`, some blocks large enough to go rank to rank between nodes."""

    def make(n: int, dtype) -> np.ndarray:
        return zcoll.empty(comm, n, dtype) if arena else np.empty(n, dtype)

    in_place = case.endswith("in place")
    if case.startswith("neighbor"):
        scounts, rcounts = ref.edge_counts(comm, rng_g, rng_l, high=700)
    elif case.startswith("alltoallv"):
        matrix = ref.count_matrix(rng_g, comm.size, large=3000)
        if in_place:
            matrix = np.maximum(matrix, matrix.T)
        scounts, rcounts = matrix[comm.rank], matrix[:, comm.rank]
    else:
        counts = ref.count_matrix(rng_g, comm.size, large=3000)[0]
        scounts, rcounts = counts[comm.rank : comm.rank + 1], counts
    sdispls, slen = ref.layout(rng_l, scounts)
    rdispls, rlen = ref.layout(rng_l, rcounts)
    send, recv = make(slen, dtype), make(rlen, dtype)
    ref.random_fill(recv, rng_l)
    if case == "alltoallv in place":
        sdispls = rdispls
    sspec = [send, (scounts, sdispls)]
    if case.startswith("allgatherv"):
        send = make(int(scounts[0]), dtype)
        sspec, sdispls = send, np.zeros(1, np.int64)
    rspec = [recv, (rcounts, rdispls)]
    if case.startswith("neighbor"):
        reference = ref.neighbor_reference("alltoallv", "p2p")

        def run_reference(s, r):
            reference(comm, s, scounts, sdispls, r, rcounts, rdispls)
    elif case.startswith("alltoallv"):

        def run_reference(s, r):
            ref.mpi_alltoallv(comm, MPI.IN_PLACE if in_place else s, scounts, sdispls, r, rcounts,
                              rdispls)  # fmt: skip
    else:

        def run_reference(s, r):
            ref.mpi_allgatherv(comm, MPI.IN_PLACE if in_place else s, int(scounts[0]), r,
                               rcounts, rdispls)  # fmt: skip

    if in_place:
        return zcoll.IN_PLACE, rspec, recv, run_reference
    return sspec, rspec, send, run_reference


@pytest.mark.parametrize("case", V_PLANS)
@pytest.mark.parametrize("mode", ["arena", "private"])
def test_irregular_plans_match_mpi(world, topologies, case, mode):
    """Each irregular plan, run three times on new data written into its buffers, against
    mpi4py's call on the same data (neighbour calls: the point-to-point reference, on a graph
    with repeated edges, so several blocks travel between one pair of ranks); in place too."""
    comm = topology_or_skip(topologies, "graph_repeated_ring") if "neighbor" in case else world
    failures = []
    if member(comm):
        rng_g, rng_l = seeded_rngs(comm, [40, V_PLANS.index(case), mode == "arena"])
        for dtype in (np.float64, np.int16):
            sendspec, recvspec, send, run_reference = _plan_buffers(
                comm, rng_g, rng_l, case, dtype, mode == "arena"
            )
            recv = recvspec[0]
            init = getattr(zcoll, case.split()[0] + "_init")
            with init(comm, sendspec, recvspec) as plan:
                for run in range(3):
                    ref.random_fill(send, rng_l)
                    expected = recv.copy()
                    run_reference(send.copy() if sendspec is not zcoll.IN_PLACE else recv.copy(),
                                  expected)  # fmt: skip
                    plan()
                    if not ref.same_bits(recv, expected):
                        failures.append(f"{np.dtype(dtype)} run {run}: "
                                        f"{ref.first_difference(recv, expected)}")  # fmt: skip
    all_ranks_agree(world, not failures, f"{case} plan ({mode}): {failures}")
