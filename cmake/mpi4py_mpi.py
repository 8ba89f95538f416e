"""The MPI that the installed mpi4py runs on, for CMakeLists.txt: prints two lines.

    <compiler wrapper of that MPI, or empty when none is found>
    <path of the MPI library mpi4py loads>

Exits 1 when mpi4py cannot be imported. ``mpi4py_mpi.py --same LIBRARY FILE...`` exits 0 when
one of the files is LIBRARY (links and linker scripts followed), else 1. MPI is not initialized: mpi4py loads its library and
answers MPI_Get_library_version before MPI_Init. The library's path is read from this process's
memory map. A wrapper is the library's own when its link line names the same file: first
<prefix>/bin/mpicc beside <prefix>/lib (installs under a prefix, MPI wheels from PyPI), then on
PATH the family's name (mpicc.mpich, mpicc.openmpi: Debian's alternatives), then mpicc.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")


def loaded_library() -> Path | None:
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1] if len(line.split()) >= 6 else ""
        name = os.path.basename(path)
        if name.startswith(("libmpi.so", "libmpich.so", "libmpi_")) and ".so" in name:
            return Path(path)
    return None


def real_library(path: Path) -> Path:
    """`path` with links resolved, and a linker script such as ``INPUT(libmpi.so.12)`` (what
    MPI wheels from PyPI ship as libmpi.so, wheels having no symbolic links) read through."""
    if path.is_file() and path.stat().st_size < 4096:
        script = re.search(r"(?:INPUT|GROUP)\s*\(\s*([^\s)]+)", path.read_text(errors="replace"))
        if script:
            target = Path(script.group(1))
            return (target if target.is_absolute() else path.parent / target).resolve()
    return path.resolve()


def link_line(wrapper: str) -> list[str]:
    for flag in ("--showme:link", "-link_info", "-show"):
        try:
            out = subprocess.run([wrapper, flag], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return []
        if out.returncode == 0 and out.stdout.strip():
            return shlex.split(out.stdout)
    return []


def links(wrapper: str, library: Path) -> bool:
    """Whether `wrapper` links `library` (the same file, links resolved)."""
    words = link_line(wrapper)
    dirs = [w[2:] for w in words if w.startswith("-L")]
    dirs += [w.split("-rpath,", 1)[1] for w in words if "-rpath," in w]
    target = library.resolve()
    for word in words:
        if word.startswith("-l"):
            for d in [*dirs, *LIBRARY_DIRS]:
                candidate = Path(d) / f"lib{word[2:]}.so"
                if candidate.exists() and real_library(candidate) == target:
                    return True
        elif ".so" in word and Path(word).exists() and real_library(Path(word)) == target:
            return True
    return False


def wrapper_for(library: Path, version: str) -> str:
    family = "mpich" if "MPICH" in version or "Intel" in version else "openmpi"
    beside = library.resolve().parent.parent / "bin" / "mpicc"
    candidates = [str(beside), str(library.parent.parent / "bin" / "mpicc")]
    candidates += [shutil.which(name) or "" for name in (f"mpicc.{family}", "mpicc")]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK) and links(candidate, library):
            return candidate
    return ""


def main() -> int:
    if sys.argv[1:2] == ["--same"]:
        library, files = real_library(Path(sys.argv[2])), sys.argv[3:]
        return 0 if any(real_library(Path(f)) == library for f in files) else 1
    try:
        import mpi4py

        mpi4py.rc.initialize = False
        mpi4py.rc.finalize = False
        from mpi4py import MPI
    except Exception as exc:  # noqa: BLE001 - any failure means: no mpi4py to ask
        print(f"mpi4py: {exc}", file=sys.stderr)
        return 1
    version = MPI.Get_library_version().strip().splitlines()[0]
    library = loaded_library()
    wrapper = wrapper_for(library, version) if library else ""
    print(wrapper)
    print(library or "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
