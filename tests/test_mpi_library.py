"""MPI handles of every MPI family, and the MPI library zcoll's C++ sender was built against.

MPICH's handles for user communicators (0x84000002, which mpi4py shows as 0xffffffff84000002)
are past a signed 64-bit integer; an older mpi4py may show the same bits as a negative number.
The binding must take both as the opaque word they are. The library check compares what the
build recorded with what mpi4py runs on; the expected texts are written here.
"""

from __future__ import annotations

import warnings

import pytest
from mpi4py import MPI

import zcoll
from zcoll import _context, _core, _mpi_library

MPICH_STYLE_HANDLES = [0xFFFFFFFF84000002, 0x84000002, -2080374782, 2**64 - 1]


@pytest.mark.parametrize("handle", MPICH_STYLE_HANDLES)
def test_contexts_register_under_any_handle(world, handle):
    """register_fast takes a handle of any MPI family (it raised TypeError past 2^63 - 1)."""
    comm = world.Dup()
    try:
        zcoll.barrier(comm)  # makes the communicator's context
        ctx = _context._by_handle[comm.handle]
        _core.register_fast(handle, ctx.core)
        _core.register_fast(handle, ctx.core, (handle, comm.rank, 1, 1))
        _core.register_fast(handle, None)
    finally:
        comm.Free()


def test_a_handle_is_an_int():
    with pytest.raises(TypeError):
        _core.register_fast("0x84000002", None)  # type: ignore[arg-type]


def test_settings_name_both_libraries():
    s = zcoll.settings()
    theirs = MPI.Get_library_version().split("\0")[0].strip().splitlines()[0].strip()
    assert s.mpi4py_library.startswith(theirs)
    build = _core.mpi_build()
    if build:
        assert s.mpi_library.startswith(build["version"].strip().splitlines()[0].strip())
        assert build["chosen_by"] in ("MPI_C_COMPILER", "MPICC", "mpi4py")
        assert s.mpi_libraries_match == s.mpi_library.startswith(theirs)
    else:
        assert s.mpi_library.startswith("none") and not s.mpi_libraries_match


def test_a_mismatch_warns_naming_both(monkeypatch):
    found = _mpi_library.MPILibraries("Open MPI v4.1.4 (libmpi.so)", "MPICH Version: 4.0.2", False)
    monkeypatch.setattr(_mpi_library, "libraries", lambda: found)
    monkeypatch.setattr(_core, "mpi_build", lambda: {"version": "Open MPI v4.1.4"})
    with pytest.warns(RuntimeWarning) as caught:
        _mpi_library.warn_on_mismatch()
    text = str(caught[0].message)
    assert "Open MPI v4.1.4 (libmpi.so)" in text and "MPICH Version: 4.0.2" in text


@pytest.mark.parametrize("build", [{}, {"version": "MPICH Version: 4.0.2"}])
def test_no_warning_without_a_sender_or_with_a_match(monkeypatch, build):
    same = _mpi_library.MPILibraries("MPICH Version: 4.0.2", "MPICH Version: 4.0.2", True)
    monkeypatch.setattr(
        _mpi_library, "libraries", lambda: same if build else same._replace(match=False)
    )
    monkeypatch.setattr(_core, "mpi_build", lambda: build)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _mpi_library.warn_on_mismatch()
