"""Block schedules (no MPI needed): coverage, balance, Morton and Hilbert structure.

Expected curves are built here independently of the C++ code: the bit interleave by explicit
bit loops, the balanced recursion by a direct Python transcription of TPDS'18 §2.2.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from zcoll import _core

ORDERS = {name: code for code, name in enumerate(_core.ORDERS)}
SIZES = list(range(1, 18)) + [24, 31, 32, 33, 64]


def curve(p: int, order: str, kind: str = "full"):
    blocks, starts = _core.schedule(p, ORDERS[order], kind)
    return [tuple(map(int, b)) for b in blocks], [int(s) for s in starts]


def interleave(dst: int, src: int, bits: int) -> int:
    """Morton code with dst in the odd bits and src in the even bits."""
    code = 0
    for b in range(bits):
        code |= ((src >> b) & 1) << (2 * b)
        code |= ((dst >> b) & 1) << (2 * b + 1)
    return code


def balanced_morton(d0: int, nd: int, s0: int, ns: int) -> list[tuple[int, int]]:
    """TPDS'18 §2.2: split the longer side (rows on a tie), first part floor(n/2)."""
    if nd == 0 or ns == 0:
        return []
    if nd == 1 and ns == 1:
        return [(d0, s0)]
    if nd >= ns:
        h = nd // 2
        return balanced_morton(d0, h, s0, ns) + balanced_morton(d0 + h, nd - h, s0, ns)
    h = ns // 2
    return balanced_morton(d0, nd, s0, h) + balanced_morton(d0, nd, s0 + h, ns - h)


@pytest.mark.parametrize("order", sorted(ORDERS))
@pytest.mark.parametrize("p", SIZES)
def test_every_block_exactly_once_and_balanced(p, order):
    blocks, starts = curve(p, order)
    assert len(blocks) == p * p
    assert sorted(blocks) == sorted(itertools.product(range(p), range(p)))
    assert starts == [r * p for r in range(p + 1)]  # P segments of exactly P blocks


@pytest.mark.parametrize("p", SIZES)
def test_row_and_column_orders(p):
    assert curve(p, "row")[0] == [(d, s) for d in range(p) for s in range(p)]
    assert curve(p, "column")[0] == [(d, s) for s in range(p) for d in range(p)]


@pytest.mark.parametrize("p", [1, 2, 4, 8, 16, 32, 64])
def test_morton_is_bit_interleave_for_powers_of_two(p):
    bits = max(1, (p - 1).bit_length())
    expected = sorted(itertools.product(range(p), range(p)), key=lambda b: interleave(*b, bits))
    assert curve(p, "morton")[0] == expected


@pytest.mark.parametrize("p", [n for n in SIZES if n & (n - 1)])
def test_morton_is_balanced_recursion_otherwise(p):
    assert curve(p, "morton")[0] == balanced_morton(0, p, 0, p)


@pytest.mark.parametrize("p", [5, 6, 7, 12, 24, 33])
def test_balanced_morton_segments_stay_compact(p):
    """No segment spans a whole row or column (unlike row/column order: TPDS'18 Fig. 4b)."""
    blocks, starts = curve(p, "morton")
    for r in range(p):
        seg = blocks[starts[r] : starts[r + 1]]
        rows = {d for d, _ in seg}
        cols = {s for _, s in seg}
        assert max(len(rows), len(cols)) < p, (r, sorted(rows), sorted(cols))


@pytest.mark.parametrize("p", SIZES)
def test_hilbert_steps_between_neighbours(p):
    blocks, _ = curve(p, "hilbert")
    for (d0, s0), (d1, s1) in zip(blocks, blocks[1:]):
        assert abs(d0 - d1) + abs(s0 - s1) == 1, (p, (d0, s0), (d1, s1))


def test_hilbert_matches_the_classic_curve_for_p4():
    # The order-2 Hilbert curve, as (row, column), starting at (0, 0) along the columns' axis.
    expected = [(0, 0), (1, 0), (1, 1), (0, 1), (0, 2), (0, 3), (1, 3), (1, 2),
                (2, 2), (2, 3), (3, 3), (3, 2), (3, 1), (2, 1), (2, 0), (3, 0)]  # fmt: skip
    got = curve(4, "hilbert")[0]
    transposed = [(s, d) for d, s in got]
    assert expected in (got, transposed)


@pytest.mark.parametrize("order", sorted(ORDERS))
@pytest.mark.parametrize("p", SIZES)
def test_in_place_schedules(p, order):
    swaps, starts = curve(p, order, "swap")
    assert sorted(swaps) == sorted((d, s) for d in range(p) for s in range(d))
    sizes = np.diff(starts)
    assert sizes.max() - sizes.min() <= 1
    offdiag, starts = curve(p, order, "offdiagonal")
    assert sorted(offdiag) == sorted((d, s) for d in range(p) for s in range(p) if d != s)
    sizes = np.diff(starts)
    assert sizes.max() - sizes.min() <= 1
    # Both keep the order of the full curve.
    full = curve(p, order)[0]
    position = {b: i for i, b in enumerate(full)}
    assert [position[b] for b in swaps] == sorted(position[b] for b in swaps)


def test_morton_decode_matches_bit_loops():
    rng = np.random.default_rng(1)
    for code in [0, 1, 2, 3, 6, 0xFFFF, *rng.integers(0, 2**40, 200).tolist()]:
        dst = sum(((code >> (2 * b + 1)) & 1) << b for b in range(32))
        src = sum(((code >> (2 * b)) & 1) << b for b in range(32))
        assert _core.morton_decode(code) == (dst, src)


def test_paper_example():
    # TPDS'18 §2.1: x = 2 (010), y = 1 (001) interleave to 000110 = 6.
    assert _core.morton_decode(6) == (1, 2)


def test_bad_arguments():
    with pytest.raises(ValueError):
        _core.schedule(0, ORDERS["row"])
    with pytest.raises(ValueError):
        _core.schedule(4, 17)
    with pytest.raises(ValueError):
        _core.schedule(4, ORDERS["row"], "diagonal")


@pytest.mark.parametrize("p", [1, 4, 6])
@pytest.mark.parametrize("order", list(ORDERS))
def test_public_schedule_matches_the_engine(p, order):
    import zcoll

    s = zcoll.schedule(p, order)
    blocks, starts = curve(p, order)
    assert [tuple(map(int, b)) for b in s.blocks] == blocks
    assert s.starts.tolist() == starts
    for r in range(p):
        assert [tuple(map(int, b)) for b in s.segment(r)] == blocks[starts[r] : starts[r + 1]]
    assert s.ranks().tolist() == [r for r in range(p) for _ in range(starts[r + 1] - starts[r])]
    with pytest.raises(ValueError):
        s.blocks[0, 0] = 1  # read-only: the schedule is shared


def test_public_schedule_kinds_and_errors():
    import zcoll

    assert len(zcoll.schedule(5, "hilbert", "swap").blocks) == 5 * 4 // 2
    assert len(zcoll.schedule(5, "row", "offdiagonal").blocks) == 5 * 4
    for bad in [(0, "row"), (True, "row"), (2.0, "row"), (4, "zorder"), (4, "row", "diag")]:
        with pytest.raises(ValueError):
            zcoll.schedule(*bad)
    with pytest.raises(ValueError, match="rank"):
        zcoll.schedule(4, "row").segment(4)


# --- order="numa" (TPDS'18 §2.4) on machines described as ZCOLL_TOPOLOGY describes them -------

NUMA_MACHINES = [
    "package:2 numa:1 core:4 pu:1",  # 2 sockets of 4
    "package:2 numa:2 core:2 pu:1",  # 4 NUMA nodes of 2
    "package:4 numa:1 core:4 pu:1",  # 4 sockets of 4
    "package:2 numa:2 core:4 pu:2",  # 4 NUMA nodes of 8 PUs
]


def placed_numa_nodes(machine: str, p: int) -> list[int]:
    """Node rank i on the machine's i-th PU (wrapping), as ZCOLL_TOPOLOGY places ranks."""
    return [_core.locate_described_pu(machine, i)["numa_node"] for i in range(p)]


def test_described_placement_follows_the_pus():
    # "package:2 numa:2 core:2 pu:1": PUs 0-1 on NUMA node 0, 2-3 on 1, ... 8 PUs, then wrap.
    got = placed_numa_nodes("package:2 numa:2 core:2 pu:1", 11)
    assert got == [0, 0, 1, 1, 2, 2, 3, 3, 0, 0, 1]
    where = _core.locate_described_pu("package:2 numa:2 core:2 pu:1", 5)
    assert (where["package"], where["numa_node"], where["core"], where["bound"]) == (1, 2, 5, False)


@pytest.mark.parametrize("kind", ["full", "swap", "offdiagonal"])
@pytest.mark.parametrize("machine", NUMA_MACHINES)
@pytest.mark.parametrize("p", [4, 5, 8, 11, 16, 24, 32])
def test_numa_schedule_on_described_machines(machine, p, kind):
    numa = placed_numa_nodes(machine, p)
    ids = sorted(set(numa))
    dom = [ids.index(n) for n in numa]
    s = len(ids)
    blocks, starts = _core.schedule(p, ORDERS["numa"], kind, numa)
    blocks = [tuple(map(int, b)) for b in blocks]
    want = {
        "full": set(itertools.product(range(p), range(p))),
        "swap": {(d, x) for d in range(p) for x in range(d)},
        "offdiagonal": {(d, x) for d in range(p) for x in range(p) if d != x},
    }[kind]
    assert len(blocks) == len(want) and set(blocks) == want  # every block exactly once
    sizes = np.diff(starts)
    for r in range(s):
        members = [e for e in range(p) if dom[e] == r]
        assert sizes[members].max() - sizes[members].min() <= 1  # balanced inside a domain
        if kind != "swap":
            assert set(sizes[members]) == {p if kind == "full" else p - 1}
        for e in members:
            steps = []
            for d, x in blocks[starts[e] : starts[e + 1]]:
                if kind == "swap":  # a swap writes both ends: one must be in e's domain
                    assert r in (dom[d], dom[x])
                    other = dom[x] if dom[d] == r else dom[d]
                else:  # each rank writes only its own domain's receive buffers
                    assert dom[d] == r
                    other = dom[x]
                steps.append((other - r) % s)
            assert steps == sorted(steps)  # step i reads domain (r + i) % s


@pytest.mark.parametrize("kind", ["full", "swap", "offdiagonal"])
@pytest.mark.parametrize("p", [1, 3, 4, 7, 16])
def test_numa_over_one_domain_is_morton(p, kind):
    morton = _core.schedule(p, ORDERS["morton"], kind)
    for numa in ([], [2] * p, [-1] + [0] * (p - 1)):
        numa_blocks, numa_starts = _core.schedule(p, ORDERS["numa"], kind, numa)
        assert np.array_equal(numa_blocks, morton[0]) and np.array_equal(numa_starts, morton[1])


def test_numa_two_sockets_of_two_is_the_papers_figure():
    # 2 domains of 2 ranks: step 0 the own 2 x 2 quadrant (Morton: rank 0 its own row), step 1
    # the other domain's columns.
    blocks, starts = _core.schedule(4, ORDERS["numa"], "full", [0, 0, 1, 1])
    seg = [[tuple(map(int, b)) for b in blocks[starts[r] : starts[r + 1]]] for r in range(4)]
    assert seg[0] == [(0, 0), (0, 1), (0, 2), (0, 3)]
    assert seg[2] == [(2, 2), (2, 3), (2, 0), (2, 1)]
    assert seg[3] == [(3, 2), (3, 3), (3, 0), (3, 1)]


def test_numa_nodes_of_the_wrong_length_raise():
    with pytest.raises(ValueError, match="NUMA node of each"):
        _core.schedule(4, ORDERS["numa"], "full", [0, 1])


def test_public_schedule_takes_numa_nodes():
    import zcoll

    s = zcoll.schedule(4, "numa", numa_nodes=[5, 5, 1, 1])  # ranks 2-3 are domain 0
    assert s.numa_nodes == (5, 5, 1, 1)
    assert s.segment(0).tolist() == [[0, 0], [0, 1], [0, 2], [0, 3]]
    assert s.segment(2).tolist() == [[2, 2], [2, 3], [2, 0], [2, 1]]
    with pytest.raises(ValueError, match="NUMA node of each"):
        zcoll.schedule(4, "numa", numa_nodes=[0, 1, 2])
