"""Benchmarks of zcoll against the references that matter, run as ``python -m zcoll.bench``.

Latency of zcoll's collectives against MPI's (OSU style, or with cold caches as in TPDS'18
Fig. 9), with the bandwidth of large blocks against a memcpy of the same bytes; zcoll.fft's
parallel FFT against mpi4py-fft's; what making and freeing costs (a new communicator and its
first call, PFFT plans, Pencils and Transfers) against MPI and mpi4py-fft; the bandwidth of
zcoll's copy kernels; and the cache misses of its block orders, simulated under valgrind (no
MPI needed)::

    mpiexec -n 8 python -m zcoll.bench alltoall
    mpiexec -n 8 python -m zcoll.bench allgather --sizes 8,4K,1M --orders row,hilbert --check
    mpiexec -n 8 python -m zcoll.bench alltoall --max 64K --json a2a.json --csv a2a.csv
    mpiexec -n 2 python -m zcoll.bench alltoall --sizes 1M,4M --copy temporal,hybrid --plot a.png
    mpiexec -n 4 python -m zcoll.bench alltoall --method cold --max 64K
    mpiexec -n 2 python -m zcoll.bench alltoall --persistent --max 16K   # plans vs plain vs MPI
    mpiexec -n 4 python -m zcoll.bench alltoallv --max 64K --check       # uneven blocks
    mpiexec -n 4 python -m zcoll.bench neighbor_alltoallv --topology 3d  # periodic 3D grid
    mpiexec -n 2 python -m zcoll.bench alltoallv --buffers numpy,heap,arena --check
    mpiexec -n 4 python -m zcoll.bench fft --sizes 64,128,256 --backend pyfftw --check
    mpiexec -n 2 python -m zcoll.bench copy --sizes 64K,16M --json copy.json
    mpiexec -n 2 python -m zcoll.bench setup --parts comm,pencil         # set-up costs
    python -m zcoll.bench cachemiss --quick          # simulated cache misses, one process

For every block size (bytes per block, i.e. per pair of ranks) and every method -- the MPI
library's ``comm.Alltoall`` / ``comm.Allgather`` on plain NumPy arrays, then zcoll with each
(block order, copy mode) on arena arrays (``--buffers``: plain or shared-heap NumPy arrays, or
several kinds side by side) -- the latency reported is the largest over the ranks of each
rank's mean per call. Iteration counts shrink as blocks grow and are capped by a time
budget per measurement, so a whole sweep stays short. Only rank 0 prints and writes files.
``--persistent`` adds the persistent collectives beside the plain calls: a zcoll plan per method
(``zcoll.alltoall_init``, run as ``plan()``), the MPI library's ``comm.Alltoall_init`` where it
has one, and ``comm.Barrier`` for reference.

Modules: :mod:`.common` (sizes and the warm timing loop from :mod:`zcoll._timing`, the cold
loop, metadata, the kinds of ``--buffers``), :mod:`.output` (``--json``, ``--csv``,
``--plot``), :mod:`.collectives`, :mod:`.vcollectives` (``alltoallv``, ``allgatherv``,
``neighbor_alltoall``, ``neighbor_allgather``, ``neighbor_alltoallv``,
``neighbor_allgatherv``), :mod:`.fft`,
:mod:`.copy`, :mod:`.setup` (making and freeing communicators and plans), :mod:`.cachemiss`
(simulated cache misses of the block orders, no MPI), :mod:`.plotting` (:func:`plot_results`
for notebooks), :mod:`.cli`.
"""

from __future__ import annotations

from .cli import COMMANDS, main, parse_args
from .collectives import (
    ALL_ORDERS,
    BANDWIDTH_BLOCKS,
    CheckError,
    is_persistent,
    mpi_persistent_missing,
    paired_bandwidth,
    parse_copy_modes,
    parse_orders,
    run_collective,
    zcoll_methods,
)
from .common import (
    COLD_ITERATIONS,
    KIB,
    MEMCPY_METHOD,
    MIB,
    MIN_ITERATIONS,
    MPI_METHOD,
    MPI_PERSISTENT_METHOD,
    PERSISTENT_SUFFIX,
    CacheFlusher,
    budget_cold_iterations,
    budget_iterations,
    common_metadata,
    default_iterations,
    format_size,
    measure,
    measure_cold,
    mpi_library,
    node_layout,
    parse_size,
    parse_sizes,
    powers_of_two,
)
from .copy import run_copy
from .fft import run_fft
from .output import write_outputs
from .plotting import load_results, plot_results, save_plot
from .setup import run_setup
from .vcollectives import run_vcollective

__all__ = [
    "ALL_ORDERS",
    "BANDWIDTH_BLOCKS",
    "COLD_ITERATIONS",
    "COMMANDS",
    "KIB",
    "MEMCPY_METHOD",
    "MIB",
    "MIN_ITERATIONS",
    "MPI_METHOD",
    "MPI_PERSISTENT_METHOD",
    "PERSISTENT_SUFFIX",
    "CacheFlusher",
    "CheckError",
    "budget_cold_iterations",
    "budget_iterations",
    "common_metadata",
    "default_iterations",
    "format_size",
    "is_persistent",
    "load_results",
    "main",
    "measure",
    "measure_cold",
    "mpi_library",
    "mpi_persistent_missing",
    "node_layout",
    "paired_bandwidth",
    "parse_args",
    "parse_copy_modes",
    "parse_orders",
    "parse_size",
    "parse_sizes",
    "plot_results",
    "powers_of_two",
    "run_collective",
    "run_copy",
    "run_fft",
    "run_setup",
    "run_vcollective",
    "save_plot",
    "write_outputs",
    "zcoll_methods",
]
