"""Run a program written for mpi4py-fft on zcoll.fft, its imports unchanged.

``import mpi4py_fft`` (and its submodules ``mpifft``, ``pencil``, ``distarray``, ``libfft``,
``fftw``, ``io``) resolves to zcoll.fft's module of the same name, so a script or test file of
mpi4py-fft runs as if only its import lines had been changed::

    mpiexec -n 2 python tools/mpi4py_fft_shim.py examples/spectral_dns_solver.py
    mpiexec -n 2 python tools/mpi4py_fft_shim.py -m pytest tests/fft/test_darray.py -q

Everything after the script (or ``-m module``) is its own command line.
"""

from __future__ import annotations

import importlib
import runpy
import sys

SUBMODULES = ("mpifft", "pencil", "distarray", "libfft", "fftw", "io")


def install() -> None:
    """Make ``mpi4py_fft`` and its submodules names for zcoll.fft's (after zcoll's 'fftw'
    backend has found mpi4py-fft's compiled FFTW module, where it is installed)."""
    importlib.import_module("zcoll.fft._backends").mpi4py_fftw()
    package = importlib.import_module("zcoll.fft")
    sys.modules["mpi4py_fft"] = package
    for name in SUBMODULES:
        module = importlib.import_module(f"zcoll.fft.{name}")
        sys.modules[f"mpi4py_fft.{name}"] = module
    fftw = sys.modules["mpi4py_fft.fftw"]
    for name in getattr(fftw, "__all__", ()):
        value = getattr(fftw, name)
        if getattr(value, "__name__", "").startswith("zcoll.fft.fftw."):
            sys.modules[f"mpi4py_fft.fftw.{name}"] = value


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    install()
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
