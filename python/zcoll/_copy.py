"""Which streaming-copy kernel this process uses: ``ZCOLL_COPY_ISA``.

The C++ core picks the best kernel the CPU runs when it is loaded (AVX-512, AVX2, SSE2, or the
portable memcpy). ``ZCOLL_COPY_ISA`` overrides it when zcoll is imported: one of
``_core.COPY_ISAS`` (``portable``, ``sse2``, ``avx2``, ``avx512``), or ``auto`` (or unset,
or empty) for the default. A name that is unknown, or that this CPU cannot run, raises
``ValueError`` at import rather than silently copying with another kernel.
"""

from __future__ import annotations

from collections.abc import Mapping

from . import _core, _settings
from ._registry import AUTO

__all__ = ["ENV_VAR", "select_from_environment"]

#: The environment variable read at import.
ENV_VAR = _settings.VARIABLES["copy_isa"].env


def _select(reading: _settings.Reading) -> str:
    if reading.value == AUTO:
        _core.select_copy_isa(_core.best_copy_isa())
    else:
        try:
            _core.select_copy_isa(reading.value)
        except ValueError as exc:
            raise ValueError(f"{ENV_VAR}={reading.text!r}: {exc}") from None
    return _core.active_copy_isa()


def select_from_environment(environ: Mapping[str, str] | None = None) -> str:
    """Select the streaming-copy kernel named by ``ZCOLL_COPY_ISA`` in `environ`.

    Parameters
    ----------
    environ : mapping, optional
        Where to read the variable; ``os.environ`` by default.

    Returns
    -------
    str
        The name of the kernel now active.

    Raises
    ------
    ValueError
        If the variable names an unknown kernel or one this CPU cannot run.
    """
    return _select(_settings.read("copy_isa", environ))


_select(_settings.current("copy_isa"))  # the value read at import
