"""Which streaming-copy kernel this process uses: ``ZCOLL_COPY_ISA``.

The C++ core picks the best kernel the CPU runs when it is loaded (AVX-512, AVX2, SSE2, or the
portable memcpy). ``ZCOLL_COPY_ISA`` overrides it when zcoll is imported: one of
``_core.COPY_ISAS`` (``portable``, ``sse2``, ``avx2``, ``avx512``), or ``auto`` (or unset,
or empty) for the default. A name that is unknown, or that this CPU cannot run, raises
``ValueError`` at import rather than silently copying with another kernel.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from . import _core

__all__ = ["ENV_VAR", "select_from_environment"]

#: The environment variable read at import.
ENV_VAR = "ZCOLL_COPY_ISA"


def select_from_environment(environ: Mapping[str, str] = os.environ) -> str:
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
    value = environ.get(ENV_VAR, "")
    name = value.strip().lower()
    if name in ("", "auto"):
        _core.select_copy_isa(_core.best_copy_isa())
    else:
        try:
            _core.select_copy_isa(name)
        except ValueError as exc:
            raise ValueError(f"{ENV_VAR}={value!r}: {exc}") from None
    return _core.active_copy_isa()


select_from_environment()
