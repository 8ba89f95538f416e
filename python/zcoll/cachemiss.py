"""``python -m zcoll.cachemiss``: the simulated cache misses of the block orders and, with
``--topology``, the bytes each order moves between NUMA domains -- one process under valgrind,
no MPI launch; the same command as ``python -m zcoll.bench cachemiss``::

    python -m zcoll.cachemiss --quick
    python -m zcoll.cachemiss --topology "package:2 numa:2 core:4 pu:1" --procs 16 \
        --orders morton,numa
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from .bench import cachemiss

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the replay with `argv` (``sys.argv[1:]`` when None); returns the exit status (see
    :func:`zcoll.bench.cachemiss.run`)."""
    return cachemiss.main(argv, prog="python -m zcoll.cachemiss")


if __name__ == "__main__":
    sys.exit(main())
