"""FFTW transforms with mpi4py-fft's interface (``mpi4py_fft.fftw``), implemented on pyFFTW.

The planners (:func:`fftn`, :func:`ifftn`, :func:`rfftn`, :func:`irfftn`, :func:`dctn`,
:func:`idctn`, :func:`dstn`, :func:`idstn`, :func:`hfftn`, :func:`ihfftn`) take mpi4py-fft's
arguments and return planned :class:`~zcoll.fft.fftw.factory.FFT` objects whose outputs and
normalization factors are mpi4py-fft's, for every precision pyFFTW was built with (single,
double and long double)::

    from zcoll.fft import fftw            # was: from mpi4py_fft import fftw

    A = fftw.aligned(8, dtype="d")
    dct = fftw.dctn(A, type=2, flags=(fftw.FFTW_ESTIMATE,))
    B = dct(A)                             # unnormalised; dct.get_normalization() == 1/16
"""

from __future__ import annotations

from .factory import (
    cleanup,
    export_wisdom,
    fftlib,
    forget_wisdom,
    get_fftw_lib,
    import_wisdom,
    set_timelimit,
)
from .xfftn import *  # noqa: F403
from .xfftn import __all__ as _xfftn_all

__all__ = [
    *_xfftn_all,
    "cleanup", "export_wisdom", "fftlib", "forget_wisdom", "get_fftw_lib", "import_wisdom",
    "set_timelimit",
]  # fmt: skip
