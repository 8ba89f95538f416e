"""zcoll.fft against mpi4py-fft itself, when it is installed: the configurations mpi4py-fft's own
tests/test_mpifft.py builds (a deterministic sample of them), each built both ways with the
same arguments: the same local slices, shapes and dtypes on every rank, and the same values.

mpi4py-fft needs FFTW's headers to build (``apt-get install libfftw3-dev; pip install
mpi4py-fft``); without it this module is skipped, saying so.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from helpers import all_ranks_agree
from helpers.fft import configurations

mpi4py_fft = pytest.importorskip(
    "mpi4py_fft", reason="mpi4py-fft is not installed (pip install mpi4py-fft; needs libfftw3-dev)"
)
import zcoll.fft  # noqa: E402

ABSTOL = {"f": 1e-4, "d": 1e-12, "g": 1e-12}


def sample(size: int, every: int = 9):
    return configurations(size)[::every]


@pytest.mark.parametrize("index", range(0, 60))
def test_same_layout_and_values_as_mpi4py_fft(world, index):
    comm = world
    configs = sample(comm.size)
    if index >= len(configs):
        pytest.skip(f"only {len(configs)} sampled configurations at P={comm.size}")
    typecode, shape, axes, grid, collapse, padding = configs[index]
    kwargs = dict(axes=axes, dtype=typecode, grid=grid, collapse=collapse, backend="fftw")
    if padding:
        kwargs["padding"] = list(padding)
    try:
        theirs = mpi4py_fft.PFFT(comm, shape, **dict(kwargs, padding=kwargs.get("padding", False)))
    except AssertionError:
        pytest.skip("mpi4py-fft rejects this configuration at this P")
    mine = zcoll.fft.PFFT(comm, shape, **kwargs)
    try:
        bad = []
        for fo in (False, True):
            if mine.local_slice(fo) != theirs.local_slice(fo):
                bad.append(f"local_slice({fo}) {mine.local_slice(fo)} vs {theirs.local_slice(fo)}")
            if tuple(mine.shape(fo)) != tuple(theirs.shape(fo)):
                bad.append(f"shape({fo})")
            if tuple(mine.global_shape(fo)) != tuple(theirs.global_shape(fo)):
                bad.append(f"global_shape({fo})")
            if mine.dtype(fo) != theirs.dtype(fo):
                bad.append(f"dtype({fo})")
        if not bad:
            rng = np.random.default_rng(comm.rank)
            u = rng.random(theirs.forward.input_array.shape).astype(typecode)
            ref = theirs.forward(u).copy()
            got = mine.forward(u).copy()
            atol = ABSTOL[np.dtype(typecode).char.lower()]
            if not np.allclose(got, ref, rtol=0, atol=atol):
                bad.append(f"forward differs by {np.abs(got - ref).max():.3g}")
            back_ref = theirs.backward(ref).copy()
            back = mine.backward(got).copy()
            if not np.allclose(back, back_ref, rtol=0, atol=atol * 10):
                bad.append(f"backward differs by {np.abs(back - back_ref).max():.3g}")
        all_ranks_agree(MPI.COMM_WORLD, not bad, f"{configs[index]}: {bad}")
    finally:
        mine.destroy()
        theirs.destroy()
