"""The MPI library behind zcoll's C++ sender against the one mpi4py runs on.

zcoll's extension sends the messages between nodes by calling MPI itself. That is right only
when it was built against the library mpi4py loaded: with two MPI libraries in one process, the
extension's calls reach a library that was never initialized. The build picks mpi4py's library
(CMakeLists.txt); when the two still differ, ``import zcoll`` warns, naming both, and calls on a
communicator that spans several nodes raise (on one node zcoll makes no MPI call of its own).
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

from mpi4py import MPI

from . import _core


class MPILibraries(NamedTuple):
    """zcoll's and mpi4py's MPI: each the first line of its ``MPI_Get_library_version`` (and
    zcoll's link line), ``"none"`` when zcoll was built without MPI."""

    zcoll: str
    mpi4py: str
    match: bool


def _first_line(text: str) -> str:
    """The first line of an MPI_Get_library_version text (which may end in NUL characters)."""
    lines = text.split("\0", 1)[0].strip().splitlines()
    return lines[0].strip() if lines else ""


def _loaded_mpi_libraries() -> str:
    """The MPI shared libraries loaded in this process (from /proc/self/maps): mpi4py's, and
    zcoll's where that is another."""
    try:
        with open("/proc/self/maps") as maps:
            return ", ".join(sorted({line.split()[-1] for line in maps if "/libmpi" in line}))
    except OSError:
        return ""


def libraries() -> MPILibraries:
    """zcoll's and mpi4py's MPI libraries, and whether the C++ sender runs on mpi4py's: the
    extension's own test (``_core.mpi_library_matches``: the same library, initialized), the
    one a context asks before it uses the sender. Local."""
    build = _core.mpi_build()
    version = MPI.Get_library_version()
    theirs = _first_line(version)
    loaded = _loaded_mpi_libraries()
    mpi4py = f"{theirs} (MPI libraries in this process: {loaded})" if loaded else theirs
    if not build:
        return MPILibraries("none (built without MPI)", mpi4py, False)
    zcoll = (
        f"{_first_line(build['version'])} ({build['libraries']}; chosen by {build['chosen_by']})"
    )
    return MPILibraries(zcoll, mpi4py, _core.mpi_library_matches(version))


def mismatch_text() -> str:
    """Why the extension cannot send messages between nodes, and what to do: the text every
    call across nodes raises with where it cannot."""
    found = libraries()
    return (
        "zcoll: this communicator spans several nodes, and zcoll sends the messages between "
        "nodes by calling MPI from its extension, which must be built against the MPI library "
        f"mpi4py runs on: zcoll's is {found.zcoll}, mpi4py's is {found.mpi4py}. Rebuild zcoll "
        "with MPICC or MPI_C_COMPILER naming mpi4py's MPI (README, Install)."
    )


def warn_on_mismatch() -> None:
    """Warn (RuntimeWarning) when zcoll's extension was built against another MPI library than
    mpi4py's; a build without MPI is a choice and says nothing, and before MPI_Init
    (mpi4py.rc.initialize = False) nothing can be told yet."""
    if not _core.mpi_build() or not MPI.Is_initialized():
        return
    found = libraries()
    if found.match:
        return
    warnings.warn(
        f"zcoll was built against another MPI library than mpi4py's: zcoll's is {found.zcoll}, "
        f"mpi4py's is {found.mpi4py}. Calls on communicators that span several nodes will "
        "raise; rebuild zcoll with MPICC or MPI_C_COMPILER naming mpi4py's MPI (README, "
        "Install).",
        RuntimeWarning,
        stacklevel=3,
    )
