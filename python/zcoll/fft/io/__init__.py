"""Parallel files of distributed arrays (mpi4py-fft's ``mpi4py_fft.io``).

``HDF5File``, ``NCFile`` and ``generate_xdmf`` write and read :class:`~zcoll.fft.DistArray`
files in mpi4py-fft's layout, so files carry over both ways. They need what mpi4py-fft's need:
h5py built with MPI (``HDF5File``; ``generate_xdmf`` needs any h5py) or netCDF4 with parallel
support (``NCFile``), and mpi4py-fft's own file code, to which they hand over. Where any of
that is missing, making one raises ImportError naming what is missing (never a wrong file);
so do ``DistArray.write`` and ``DistArray.read``.
"""

from __future__ import annotations

__all__ = ["HDF5File", "NCFile", "generate_xdmf"]


def _missing(kind: str) -> str:
    """What is missing for `kind` ("hdf5", "netcdf" or "xdmf"), or "" when nothing is."""
    if kind in ("hdf5", "xdmf"):
        try:
            import h5py
        except ImportError:
            return "h5py is not installed (install h5py built with MPI, e.g. h5py[mpi])"
        if kind == "hdf5" and not h5py.get_config().mpi:
            return "h5py is installed without MPI support (install h5py built with MPI)"
    else:
        try:
            import netCDF4
        except ImportError:
            return "netCDF4 is not installed (install netCDF4 with parallel support)"
        if not getattr(netCDF4, "__has_parallel4_support__", False) and not getattr(
            netCDF4, "__has_pnetcdf_support__", False
        ):
            return "netCDF4 is installed without parallel support"
    try:
        import mpi4py_fft.io  # noqa: F401
    except ImportError as exc:
        return f"the file layout is mpi4py-fft's and its io module is not importable ({exc})"
    return ""


def _require(kind: str, name: str) -> None:
    if why := _missing(kind):
        raise ImportError(f"zcoll.fft.io.{name}: {why}")


class HDF5File:
    """mpi4py-fft's ``HDF5File(h5name, domain=None, mode='a', **kw)``; needs h5py with MPI."""

    def __new__(cls, *args, **kwargs):
        _require("hdf5", "HDF5File")
        from mpi4py_fft.io import HDF5File as Impl

        return Impl(*args, **kwargs)


class NCFile:
    """mpi4py-fft's ``NCFile(ncname, domain=None, mode='a', clobber=True, **kw)``; needs
    netCDF4 with parallel support."""

    def __new__(cls, *args, **kwargs):
        _require("netcdf", "NCFile")
        from mpi4py_fft.io import NCFile as Impl

        return Impl(*args, **kwargs)


def generate_xdmf(h5filename, periodic=True, order="paraview"):
    """mpi4py-fft's ``generate_xdmf``: an XDMF file describing `h5filename`; needs h5py."""
    _require("xdmf", "generate_xdmf")
    from mpi4py_fft.io import generate_xdmf as impl

    return impl(h5filename, periodic=periodic, order=order)
