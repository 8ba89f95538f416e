"""The shared heap: NumPy arrays of an unmodified program allocated in node shared memory.

TPDS'18 §2 overrides the allocator so that a program's own buffers can be read by its node
peers; zcoll does the same through NumPy's memory handler (NEP 49). With the heap on, the data
of every array of at least 1 KiB that NumPy allocates in this context comes from memory the
node's ranks can map (memfd segments, nothing in /dev/shm), and zcoll's collectives use such
arrays in place, as they use :func:`zcoll.empty` arrays: one copy per block, in the schedule's
order. Smaller arrays stay with NumPy's allocator (calls that small copy through the eager path
anyway), and so do arrays of 32 MiB or more where the kernel gives shared memory no huge pages
(``heap_stats()["shmem_huge_pages"]``): first touching them would cost about 5 times NumPy's
own (which uses huge pages), and collectives on them gain little over CMA.

It is off by default: a ``fork`` child copies every heap segment into private memory (NumPy's
semantics, at the cost of a copy of the heap), each array of 1 MiB or more holds a file
descriptor while it lives, and NumPy's handler is per context (a new thread allocates with
NumPy's default until it switches the heap on itself). Arrays made without it still move with
one copy above a measured size, by CMA (``zcoll.settings().cma``).
"""

from __future__ import annotations

import types

from . import _core, _settings

__all__ = ["heap_stats", "in_heap", "use_shared_heap"]


class use_shared_heap:  # noqa: N801 - used as a function, like numpy.errstate
    """Allocate NumPy array data on the node's shared heap (or, with ``enable=False``, with
    NumPy's default allocator) from now on, in the current thread's context.

    Called, it switches at once; as a context manager, only within the ``with`` block (the
    previous handler comes back at its end). ``ZCOLL_SHARED_HEAP=1`` switches it on at import,
    so that an unmodified script run under ``mpiexec`` gets it. Arrays keep the allocator that
    made them: heap arrays made inside the block stay valid, and shared, after it.

    Parameters
    ----------
    enable : bool
        True: the shared heap; False: NumPy's default allocator.

    Examples
    --------
    >>> import numpy as np, zcoll
    >>> with zcoll.use_shared_heap():
    ...     a = np.zeros((4, 1 << 16))
    >>> zcoll.in_heap(a)
    True
    """

    def __init__(self, enable: bool = True) -> None:
        handler = _core.heap_handler() if enable else _core.default_handler()
        self._previous = _core.set_memory_handler(handler)

    def __enter__(self) -> use_shared_heap:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        _core.set_memory_handler(self._previous)


def in_heap(a) -> bool:
    """Whether the data of array `a` (any buffer) lies in this process's shared heap."""
    return _core.in_heap(a)


def heap_stats() -> dict:
    """The heap's state in this process: ``segments`` and ``segment_bytes`` it owns,
    ``blocks`` handed out, ``kept_bytes`` (freed segments kept for reuse), ``attached`` peer
    segments mapped here, ``forked_child``, the sizes it takes (``small_bytes`` up to
    ``huge_bytes``; a segment each from ``large_bytes``) and the kernel's
    ``shmem_huge_pages`` mode."""
    return _core.heap_stats()


if _settings.current("shared_heap").value == "1":
    use_shared_heap()
