"""mpi4py-only references for tests/test_vcoll.py (nothing here imports zcoll).

- Buffer layouts: seeded counts and displacements with zeros, holes and permuted blocks.
- mpi4py's own collectives on byte views (every bit compared, NaNs and padding included), always
  with explicit counts; the neighbourhood ones blocking (see the Open MPI notes below).
- A point-to-point reference of the neighbourhood collectives (Isend/Irecv), written from the
  MPI-4.1 text (section 8.6): for (distributed) graphs the k-th send from s to d matches the k-th
  receive at d from s; for Cartesian topologies, per dimension d, slot 2d (the negative
  direction, the Shift source) receives the block its neighbour sent in the positive direction
  (that neighbour's slot 2d + 1) and slot 2d + 1 the one sent in the negative direction, also
  where both neighbours are one rank (periodic dimension of 1 or 2); PROC_NULL slots move no
  data. tests/test_vcoll.py checks it against mpi4py on every topology it uses.
- Process topologies: Cartesian grids and (distributed) graphs, built identically on every rank.

Open MPI 4.1 (Debian's 4.1.4, on the machines this project runs on), found while writing these
tests:

- MPI_Neighbor_alltoall fails (MPI_ERR_TRUNCATE on the ranks concerned, sometimes a hang) as
  soon as a rank's sendcount * size(sendtype) differs from its own recvcount * size(recvtype),
  even where every pair that exchanges data agrees (a chain 0 -> 1 -> 2 with 1 element on the
  first edge and 2 on the second fails on rank 1; so does a rank with in-degree 0 whose unused
  recvcount is 0); MPI_Neighbor_allgather on that chain never returns on rank 1. That is the
  MPI_ERR_TRUNCATE once seen on a distributed graph where, at P = 5, rank 2 had sources [] and
  destinations [1, 1]: mpi4py infers the counts of ``comm.Neighbor_alltoall(send, recv)`` from
  the buffers and the degrees (size // degree, the whole size for a degree below 2), which gives
  count 0 on the side whose degree is 0, so ranks of in- or out-degree 0 pass differing counts.
  Neither the repeated destination nor the empty source list matters by itself: count 0 on all
  ranks passes, and so does the same graph with one count on both sides of every rank. Upstream,
  open-mpi/ompi#14452 reports exactly this and was closed as not a bug: MPI-4.1 section 9.6.2
  asks the type signature of sendcount/sendtype on a process to equal that of
  recvcount/recvtype "at any other MPI process", not only at the processes it exchanges with.
  So the references here always pass explicit counts, one count (in bytes) on every rank for the
  block variants; where a test uses the buffer specifications a user would pass (implicit
  counts) on graphs with degree-0 ranks, it compares against the point-to-point reference
  instead. The v-variants (Neighbor_alltoallv/allgatherv) take any per-edge counts.
- Blocking MPI_Neighbor_alltoall(v) on a periodic Cartesian dimension of size 1 or 2 follows
  MPI-4.1 (coll/basic sends and receives per direction). The nonblocking
  MPI_Ineighbor_alltoall (coll/libnbc) does not: it delivers the block sent toward the positive
  side into the receiver's positive slot (open-mpi/ompi#14430, fixed upstream by
  open-mpi/ompi#14416); the references never use it.

MPICH 4.0.2 (Debian 12's, the MPICH family: Intel MPI, Cray MPICH, MVAPICH), found when the
suite first ran on it:

- MPI_Neighbor_alltoall(v) does not keep the k-th-send-matches-k-th-receive order between one
  pair of ranks: on a distributed graph with the edge 0 -> 1 twice, rank 1 receives rank 0's
  two blocks swapped; on a periodic Cartesian dimension of size 2 (both neighbours one rank) the
  two directions' blocks land swapped (the very case Open MPI's libnbc got wrong, above); and
  the topologies with such edges differ from the point-to-point reference. Where the probe below
  finds this, the neighbourhood references are the point-to-point ones
  (``neighbourhood_follows_standard``), and the test that compares MPI with them is skipped,
  saying so.
- MPI_Allgatherv on a communicator of one rank ignores the receive displacement: the block
  lands at offset 0. ``mpi_allgatherv`` then places it with NumPy (the whole of a one-rank
  allgatherv) where the probe finds this.
"""

from __future__ import annotations

import functools
from collections import defaultdict, deque

import numpy as np
from mpi4py import MPI

# --- bytes ------------------------------------------------------------------------------------


def as_bytes(a: np.ndarray) -> np.ndarray:
    """The bytes of a C-contiguous array, as a 1-D uint8 view (writable if `a` is)."""
    assert a.flags.c_contiguous
    return a.reshape(-1).view(np.uint8)


def random_fill(a: np.ndarray, rng: np.random.Generator) -> None:
    """Random bytes into `a` (every bit pattern: NaNs, odd bools, padding bytes)."""
    as_bytes(a)[:] = rng.integers(0, 256, a.nbytes, dtype=np.uint8)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def first_difference(got: np.ndarray, want: np.ndarray) -> str:
    """Where two arrays of one shape first differ, in elements (for failure messages)."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"shape/dtype {got.shape}/{got.dtype} != {want.shape}/{want.dtype}"
    g = got.reshape(-1).view(np.uint8).reshape(-1, got.itemsize) if got.size else got
    w = want.reshape(-1).view(np.uint8).reshape(-1, want.itemsize) if want.size else want
    bad = np.flatnonzero((g != w).any(axis=1)) if got.size else []
    if not len(bad):
        return "identical"
    return f"{len(bad)} of {got.size} elements differ, first at element {int(bad[0])}"


def mpi_datatype(dtype) -> MPI.Datatype | None:
    """mpi4py's predefined datatype for a NumPy dtype (None where MPI has none: float16)."""
    try:
        datatype = MPI.Datatype.fromcode(np.dtype(dtype).char)
    except (KeyError, ValueError, MPI.Exception):
        return None
    if datatype == MPI.DATATYPE_NULL:
        return None
    try:
        datatype.Get_size()
    except MPI.Exception:
        return None
    return datatype


# --- layouts ----------------------------------------------------------------------------------


def packed_displs(counts) -> np.ndarray:
    counts = np.asarray(counts, np.int64)
    displs = np.zeros(counts.size, np.int64)
    if counts.size:
        np.cumsum(counts[:-1], out=displs[1:])
    return displs


def layout(rng: np.random.Generator, counts, *, holes: bool = True, permute: bool = True,
           overlap: bool = False) -> tuple[np.ndarray, int]:  # fmt: skip
    """Displacements (in elements) of blocks of `counts` in one buffer, and the buffer's size.

    Blocks in a random order (`permute`) with random gaps before, between and after them
    (`holes`); `overlap` (send buffers only, which MPI lets overlap) moves some blocks onto
    others. Every block, zero-sized ones included, lies inside the buffer."""
    counts = np.asarray(counts, np.int64)
    n = counts.size
    order = rng.permutation(n) if permute else np.arange(n)
    displs = np.zeros(n, np.int64)
    pos = int(rng.integers(0, 4)) if holes else 0
    for i in order:
        displs[i] = pos
        pos += int(counts[i]) + (int(rng.integers(0, 6)) if holes else 0)
    size = pos + (int(rng.integers(0, 4)) if holes else 0)
    if overlap:
        for i in range(n):
            if rng.random() < 0.5:
                displs[i] = int(rng.integers(0, size - int(counts[i]) + 1))
    return displs, size


def count_matrix(rng: np.random.Generator, p: int, *, zeros: float = 0.3, high: int = 40,
                 large: int = 0) -> np.ndarray:  # fmt: skip
    """counts[i, j] = elements rank i sends to rank j: zeros, small values and (with `large`)
    a few large blocks. Drawn from a generator seeded alike on every rank."""
    counts = rng.integers(0, high + 1, (p, p))
    counts[rng.random((p, p)) < zeros] = 0
    if large:
        counts[rng.random((p, p)) < 0.25] = large
    return counts.astype(np.int64)


# --- mpi4py's collectives on bytes, explicit counts -------------------------------------------


def _vspec(a: np.ndarray, counts, displs) -> list:
    k = a.itemsize
    counts = [int(c) * k for c in counts]
    displs = [int(d) * k for d in displs]
    return [as_bytes(a), (counts, displs), MPI.BYTE]


def mpi_alltoallv(comm, send, scounts, sdispls, recv, rcounts, rdispls) -> None:
    """comm.Alltoallv on byte views; `send` may be MPI.IN_PLACE (recv's layout used)."""
    sendspec = MPI.IN_PLACE if send is MPI.IN_PLACE else _vspec(send, scounts, sdispls)
    comm.Alltoallv(sendspec, _vspec(recv, rcounts, rdispls))


@functools.cache
def neighbourhood_follows_standard() -> bool:
    """Whether this MPI's neighbourhood collectives keep the k-th send from s to d matched with
    the k-th receive at d from s (MPI-4.1 section 8.6): probed locally, on COMM_SELF, with a
    distributed graph whose one edge 0 -> 0 is listed twice."""
    graph = MPI.COMM_SELF.Create_dist_graph_adjacent([0, 0], [0, 0], reorder=False)
    send, recv = np.array([1, 2], np.int32), np.zeros(2, np.int32)
    try:
        graph.Neighbor_alltoall([send, 1, MPI.INT], [recv, 1, MPI.INT])
    finally:
        graph.Free()
    return recv.tolist() == [1, 2]


@functools.cache
def allgatherv_on_one_rank_follows_standard() -> bool:
    """Whether this MPI's Allgatherv on a one-rank communicator honours the displacement."""
    send, recv = np.array([5], np.int32), np.zeros(3, np.int32)
    MPI.COMM_SELF.Allgatherv([send, 1, MPI.INT], [recv, ([1], [2]), MPI.INT])
    return recv.tolist() == [0, 0, 5]


def mpi_allgatherv(comm, send, count, recv, rcounts, rdispls) -> None:
    """comm.Allgatherv on byte views; `send` may be MPI.IN_PLACE. On one rank, where MPI
    ignores the displacement (MPICH, above), the block is placed with NumPy."""
    if comm.size == 1 and not allgatherv_on_one_rank_follows_standard():
        if send is not MPI.IN_PLACE:
            k, start = recv.itemsize, int(rdispls[0]) * recv.itemsize
            as_bytes(recv)[start : start + int(count) * k] = as_bytes(send)[: int(count) * k]
        return
    if send is MPI.IN_PLACE:
        sendspec = MPI.IN_PLACE
    else:
        sendspec = [as_bytes(send), int(count) * send.itemsize, MPI.BYTE]
    comm.Allgatherv(sendspec, _vspec(recv, rcounts, rdispls))


def mpi_neighbor_alltoall(comm, send, recv, block: int) -> None:
    """comm.Neighbor_alltoall, `block` elements per block, the same count on both sides of
    every rank (see the module docstring: Open MPI requires it)."""
    k = send.itemsize
    comm.Neighbor_alltoall([as_bytes(send), block * k, MPI.BYTE],
                           [as_bytes(recv), block * k, MPI.BYTE])  # fmt: skip


def mpi_neighbor_allgather(comm, send, recv) -> None:
    k = send.itemsize
    comm.Neighbor_allgather([as_bytes(send), send.size * k, MPI.BYTE],
                            [as_bytes(recv), send.size * k, MPI.BYTE])  # fmt: skip


def mpi_neighbor_alltoallv(comm, send, scounts, sdispls, recv, rcounts, rdispls) -> None:
    comm.Neighbor_alltoallv(_vspec(send, scounts, sdispls), _vspec(recv, rcounts, rdispls))


def mpi_neighbor_allgatherv(comm, send, count, recv, rcounts, rdispls) -> None:
    comm.Neighbor_allgatherv([as_bytes(send), int(count) * send.itemsize, MPI.BYTE],
                             _vspec(recv, rcounts, rdispls))  # fmt: skip


def neighbor_reference(name: str, reference: str = "mpi"):
    """The reference of neighbourhood call `name` (alltoall, allgather, alltoallv,
    allgatherv): MPI's own when `reference` is "mpi" and this MPI follows the standard there,
    else the point-to-point one."""
    mpi, p2p = {
        "alltoall": (mpi_neighbor_alltoall, p2p_neighbor_alltoall),
        "allgather": (mpi_neighbor_allgather, p2p_neighbor_allgather),
        "alltoallv": (mpi_neighbor_alltoallv, p2p_neighbor_alltoallv),
        "allgatherv": (mpi_neighbor_allgatherv, p2p_neighbor_allgatherv),
    }[name]
    return mpi if reference == "mpi" and neighbourhood_follows_standard() else p2p


# --- the point-to-point reference of the neighbourhood collectives ----------------------------

_TAG = 0x5EED0  # tags of the reference's messages: _TAG + the Cartesian direction, or _TAG


def neighbour_lists(comm) -> tuple[list, list, list, list]:
    """(sources, destinations, receive tags, send tags) of this rank in MPI's neighbour order
    (PROC_NULL entries kept). Cartesian: per dimension d the Shift source then the Shift
    destination, on both sides; a block's tag is the sender's slot, and receive slot 2d (from the
    source) takes the source's slot 2d + 1 (sent in the positive direction), slot 2d + 1 the
    destination's slot 2d. Graphs: tag 0 everywhere (k-th send matches k-th receive)."""
    kind = comm.Get_topology()
    if kind == MPI.CART:
        sources, dests, rtags, stags = [], [], [], []
        for d in range(comm.Get_dim()):
            below, above = comm.Shift(d, 1)
            sources += [below, above]
            dests += [below, above]
            stags += [2 * d, 2 * d + 1]
            rtags += [2 * d + 1, 2 * d]
        return sources, dests, rtags, stags
    if kind == MPI.DIST_GRAPH:
        sources, dests, _ = comm.Get_dist_neighbors()
        return list(sources), list(dests), [0] * len(sources), [0] * len(dests)
    if kind == MPI.GRAPH:
        neighbours = list(comm.Get_neighbors(comm.rank))
        zeros = [0] * len(neighbours)
        return neighbours, list(neighbours), zeros, list(zeros)
    raise ValueError("no process topology")


def degrees(comm) -> tuple[int, int]:
    """(indegree, outdegree) as MPI counts them (Cartesian: 2 * ndims, PROC_NULL included)."""
    sources, dests, _, _ = neighbour_lists(comm)
    return len(sources), len(dests)


def live_slots(comm) -> list[int]:
    """The receive slots whose source is not PROC_NULL (the ones a collective writes)."""
    sources = neighbour_lists(comm)[0]
    return [j for j, s in enumerate(sources) if s != MPI.PROC_NULL]


def p2p_neighbor_alltoallv(comm, send, scounts, sdispls, recv, rcounts, rdispls) -> None:
    """Neighbour alltoallv by Isend/Irecv (counts and displacements in elements)."""
    sources, dests, rtags, stags = neighbour_lists(comm)
    k = recv.itemsize
    sbytes, rbytes = as_bytes(send), as_bytes(recv)
    reqs = []
    for j, (src, tag) in enumerate(zip(sources, rtags)):
        if src != MPI.PROC_NULL:
            lo = int(rdispls[j]) * k
            part = rbytes[lo : lo + int(rcounts[j]) * k]
            reqs.append(comm.Irecv([part, MPI.BYTE], src, _TAG + tag))
    for i, (dst, tag) in enumerate(zip(dests, stags)):
        if dst != MPI.PROC_NULL:
            lo = int(sdispls[i]) * k
            part = sbytes[lo : lo + int(scounts[i]) * k]
            reqs.append(comm.Isend([part, MPI.BYTE], dst, _TAG + tag))
    MPI.Request.Waitall(reqs)


def p2p_neighbor_alltoall(comm, send, recv, block: int) -> None:
    indeg, outdeg = degrees(comm)
    p2p_neighbor_alltoallv(comm, send, [block] * outdeg, np.arange(outdeg) * block,
                           recv, [block] * indeg, np.arange(indeg) * block)  # fmt: skip


def p2p_neighbor_allgatherv(comm, send, count, recv, rcounts, rdispls) -> None:
    outdeg = degrees(comm)[1]
    p2p_neighbor_alltoallv(comm, send, [count] * outdeg, [0] * outdeg, recv, rcounts, rdispls)


def p2p_neighbor_allgather(comm, send, recv) -> None:
    indeg = degrees(comm)[0]
    n = send.size
    p2p_neighbor_allgatherv(comm, send, n, recv, [n] * indeg, np.arange(indeg) * n)


def edge_tuples(comm) -> list[tuple[int, int, int, int]]:
    """Collective: every (sender, receiver, send slot, receive slot) of the topology, the same
    on every rank, by the matching rule of `neighbour_lists`."""
    everyone = comm.allgather(neighbour_lists(comm))
    pending: dict = defaultdict(deque)
    for s, (_, dests, _, stags) in enumerate(everyone):
        for i, (d, t) in enumerate(zip(dests, stags)):
            if d != MPI.PROC_NULL:
                pending[(s, d, t)].append(i)
    tuples = []
    for d, (sources, _, rtags, _) in enumerate(everyone):
        for j, (s, t) in enumerate(zip(sources, rtags)):
            if s != MPI.PROC_NULL:
                tuples.append((s, d, pending[(s, d, t)].popleft(), j))
    assert not any(pending.values()), "unmatched sends: not a valid topology"
    return tuples


def edge_counts(comm, rng_global: np.random.Generator, rng_local: np.random.Generator,
                high: int = 12) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Collective: seeded per-edge counts (zeros included) that agree between the two ends of
    every edge: (counts per send slot, counts per receive slot) of this rank. PROC_NULL slots
    get arbitrary counts (MPI moves nothing there)."""
    tuples = edge_tuples(comm)
    indeg, outdeg = degrees(comm)
    scounts = rng_local.integers(0, high + 1, outdeg).astype(np.int64)
    rcounts = rng_local.integers(0, high + 1, indeg).astype(np.int64)
    values = rng_global.integers(0, high + 1, len(tuples))
    values[rng_global.random(len(tuples)) < 0.25] = 0
    for (s, d, i, j), c in zip(tuples, values.tolist()):
        if s == comm.rank:
            scounts[i] = c
        if d == comm.rank:
            rcounts[j] = c
    return scounts, rcounts


# --- process topologies -----------------------------------------------------------------------


def _cart(world, dims, periods):
    if int(np.prod(dims)) > world.size:
        return None
    return world.Create_cart(list(dims), periods=list(periods), reorder=False)


def random_edges(p: int, seed: int) -> list[tuple[int, int]]:
    """A seeded multigraph on p ranks: asymmetric, self-loops, repeated edges; rank 0 has
    in-degree 0 and rank p - 1 out-degree 0 (p >= 2)."""
    rng = np.random.default_rng(seed)
    edges = []
    for s in range(p):
        for d in range(p):
            edges += [(s, d)] * int(rng.choice([0, 0, 0, 1, 1, 2, 3]))
    if p >= 2:
        edges = [(s, d) for s, d in edges if d != 0 and s != p - 1]
        # a repeated edge from the rank with no in-edges
        edges += [(0, max(1, p - 2))] * 2
    order = rng.permutation(len(edges))
    return [edges[i] for i in order]


def _adjacent(world, edges, seed: int, weighted: bool):
    """Create_dist_graph_adjacent from an edge list: each rank lists its in- and out-edges in a
    seeded order (any order: the k-th matching follows the lists)."""
    r = world.rank
    rng = np.random.default_rng([seed, r])
    sources = [s for s, d in edges if d == r]
    dests = [d for s, d in edges if s == r]
    sources = [sources[i] for i in rng.permutation(len(sources))]
    dests = [dests[i] for i in rng.permutation(len(dests))]
    if weighted:
        sw = rng.integers(0, 100, len(sources)).tolist()
        dw = rng.integers(0, 100, len(dests)).tolist()
        return world.Create_dist_graph_adjacent(sources, dests, sw, dw, reorder=False)
    return world.Create_dist_graph_adjacent(sources, dests, reorder=False)


def _general(world, edges, seed: int, weighted: bool):
    """Create_dist_graph (not adjacent): each edge specified by a seeded rank, grouped by
    source."""
    rng = np.random.default_rng(seed)
    owner = rng.integers(0, world.size, len(edges))
    mine: dict[int, list[int]] = {}
    for (s, d), o in zip(edges, owner.tolist()):
        if o == world.rank:
            mine.setdefault(s, []).append(d)
    sources = sorted(mine)
    degs = [len(mine[s]) for s in sources]
    dests = [d for s in sources for d in mine[s]]
    weights = list(range(1, len(dests) + 1)) if weighted else None
    return world.Create_dist_graph(sources, degs, dests, weights, reorder=False)


def _graph_ring_with_self(world):
    """Create_graph: neighbours of r are r+1, r-1 and r itself (symmetric; repeated at P <= 2)."""
    p = world.size
    index, edges = [], []
    for r in range(p):
        edges += [(r + 1) % p, (r - 1) % p, r]
        index.append(len(edges))
    return world.Create_graph(index, edges, reorder=False)


def _repeated_ring(world):
    """Every rank sends three times to r+1 and once to itself."""
    p = world.size
    edges = [(r, (r + 1) % p) for r in range(p) for _ in range(3)] + [(r, r) for r in range(p)]
    return _adjacent(world, edges, seed=77, weighted=False)


def _compute_dims(p: int, n: int) -> list[int]:
    return list(MPI.Compute_dims(p, n))


TOPOLOGIES = {
    "cart1d_periodic": lambda w: _cart(w, [w.size], [True]),
    "cart1d_open": lambda w: _cart(w, [w.size], [False]),
    "cart2d_periodic": lambda w: _cart(w, _compute_dims(w.size, 2), [True, True]),
    "cart2d_mixed": lambda w: _cart(w, _compute_dims(w.size, 2), [True, False]),
    "cart3d_open": lambda w: _cart(w, _compute_dims(w.size, 3), [False] * 3),
    "cart3d_mixed": lambda w: _cart(w, _compute_dims(w.size, 3), [True, False, True]),
    # a dimension of 1: periodic (the rank is both its neighbours) and not (PROC_NULL twice)
    "cart_unit_dims": lambda w: _cart(w, [1, w.size, 1], [True, True, False]),
    # a periodic dimension of 2: both neighbours are the same other rank (a subset of the ranks
    # when P is odd: the others get COMM_NULL)
    "cart_two_periodic": lambda w: _cart(w, [2, max(w.size // 2, 1)], [True, True]),
    "graph_adjacent": lambda w: _adjacent(w, random_edges(w.size, 11), 11, weighted=False),
    "graph_adjacent_weighted": lambda w: _adjacent(w, random_edges(w.size, 12), 12, weighted=True),
    "graph_general": lambda w: _general(w, random_edges(w.size, 13), 13, weighted=False),
    "graph_general_weighted": lambda w: _general(w, random_edges(w.size, 14), 14, weighted=True),
    "graph_repeated_ring": _repeated_ring,
    "graph_empty": lambda w: w.Create_dist_graph_adjacent([], [], reorder=False),
    "graph_classic": _graph_ring_with_self,
}


def make_topology(world, name: str):
    """Collective: the topology communicator `name` over `world` (COMM_NULL on ranks outside
    it), or None on every rank where it does not fit this size."""
    return TOPOLOGIES[name](world)
