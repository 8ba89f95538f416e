"""zcoll.fft's tests: expected values and layouts written out independently of zcoll.fft, and
the configurations of mpi4py-fft's own test sweep."""

from __future__ import annotations

import itertools

import numpy as np


def global_array(shape, dtype, seed: int = 0) -> np.ndarray:
    """The same seeded array on every rank."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal(shape)
    return a.astype(dtype)


def abs_err(got, ref) -> float:
    got, ref = np.asarray(got), np.asarray(ref)
    if got.shape != ref.shape:
        return np.inf
    return float(np.abs(got - ref).max()) if got.size else 0.0


def rel_err(got, ref) -> float:
    """Largest error relative to the largest value of `ref` (inf for another shape)."""
    got, ref = np.asarray(got), np.asarray(ref)
    if got.shape != ref.shape:
        return np.inf
    if not got.size:
        return 0.0
    return float(np.abs(got - ref).max()) / max(float(np.abs(ref).max()), 1e-300)


def block(n: int, p: int, r: int) -> slice:
    """mpi4py-fft's block distribution: the first n % p ranks hold one more element."""
    start = r * (n // p) + min(r, n % p)
    return slice(start, start + n // p + (r < n % p))


def tiles(comm, global_shape, dims, local_slice) -> bool:
    """The ranks' slices cover the global array exactly once, each axis in mpi4py-fft blocks
    over `dims` processes."""
    everyone = comm.allgather(tuple((s.start, s.stop) for s in local_slice))
    count = np.zeros(global_shape, np.int64)
    for part in everyone:
        count[tuple(slice(*s) for s in part)] += 1
    ok = bool((count == 1).all())
    for k, (n, p) in enumerate(zip(global_shape, dims)):
        blocks = {(b.start, b.stop) for b in (block(n, p, r) for r in range(p))}
        ok &= {part[k] for part in everyone} == blocks
    return ok


def collapsed(groups: list[list[int]], dims) -> list[list[int]]:
    """mpi4py-fft's collapse: every group of axes local on input joins the first-transformed."""
    merged: list[list[int]] = [[]]
    for g in reversed(groups):
        if all(dims[a] == 1 for a in g):
            merged[0] = g + merged[0]
        else:
            merged.insert(0, g)
    return merged


def configurations(size: int):
    """mpi4py-fft's test_mpifft sweep (its dims, sizes, grids, axes forms, collapse, padding)."""
    grids = {2: (None,), 3: ((-1,), None), 4: ((-1,), None)}
    out = []
    for typecode in "fdFD":
        for dim in (2, 3, 4):
            for shape in itertools.product(*([(12, 13)] * dim)):
                if dim < 3:
                    n = min(shape)
                    if typecode in "fd":
                        n = n // 2 + 1
                    if n < size:
                        continue
                for grid in grids[dim]:
                    if dim < 3:
                        allaxes = [None, (-1,), (-2,), (-1, -2), (-2, -1), (-1, 0), (0, -1),
                                   ((0,), (1,))]  # fmt: skip
                    elif dim < 4:
                        allaxes = [None, ((0,), (1, 2)), ((0,), (-2, -1))]
                    else:
                        allaxes = [None, ((0,), (1,), (2,), (3,)), ((0,), (1, 2, 3)),
                                   ((0,), (1,), (2, 3))]  # fmt: skip
                    for axes, collapse in itertools.product(allaxes, (True, False)):
                        out.append((typecode, shape, axes, _slab(grid, axes, shape), collapse,
                                    False))  # fmt: skip
                    for axes in allaxes[:2]:
                        padding = [1.5] * dim
                        out.append((typecode, shape, axes, _slab(grid, axes, shape), False,
                                    padding))  # fmt: skip
    return out


def _slab(grid, axes, shape):
    if grid is None:
        return None
    ax = -1 if axes is None else axes[-1] if isinstance(axes[-1], int) else axes[-1][-1]
    slab = (ax + 1) % len(shape)
    g = [1] * (slab + 1)
    g[slab] = 0
    return g
