"""The command line of ``python -m zcoll.bench``: one subcommand per benchmark."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

from mpi4py import MPI

from zcoll import _context
from zcoll._registry import ALLGATHER, ALLTOALL, AUTO

from . import alloc, cachemiss, crossover, setup
from .collectives import ALL_ORDERS, add_collective_options, run_collective, zcoll_methods
from .common import MIB, parse_size, parse_sizes, powers_of_two
from .copy import COPY_LOOPS, COPY_SIZES, COPY_TIME_BUDGET, run_copy
from .fft import (
    FFT_DTYPES,
    FFT_ITERATIONS,
    FFT_ROUNDS,
    FFT_SIZES,
    FFT_TIME_BUDGET,
    parse_fft_sizes,
    parse_grid,
    run_fft,
)
from .reductions import (
    REDUCTION_COMMANDS,
    add_reduction_options,
    finish_reduction_args,
    run_reduction,
)
from .vcollectives import (
    MPI_NAMES,
    VCOLLECTIVE_COMMANDS,
    add_vcollective_options,
    finish_vcollective_args,
    run_vcollective,
)

__all__ = ["COMMANDS", "main", "run_cachemiss"]


def run_cachemiss(comm: MPI.Comm, args: argparse.Namespace) -> int:
    """``cachemiss``: rank 0 replays (see :mod:`.cachemiss`); every rank returns its status."""
    return comm.bcast(cachemiss.run(args) if comm.rank == 0 else None, root=0)


#: Subcommand name -> (function(comm, args) -> exit status, help), with its options in
#: ``_OPTIONS``.
COMMANDS: dict[str, tuple[Callable[[MPI.Comm, argparse.Namespace], int], str]] = {
    ALLTOALL: (run_collective, "zcoll.alltoall vs comm.Alltoall"),
    ALLGATHER: (run_collective, "zcoll.allgather vs comm.Allgather"),
    **{
        name: (run_vcollective, f"zcoll.{name} vs comm.{MPI_NAMES[name]}")
        for name in VCOLLECTIVE_COMMANDS
    },
    "allreduce": (run_reduction, "zcoll.allreduce (each algorithm) vs comm.Allreduce"),
    "reduce": (run_reduction, "zcoll.reduce (each algorithm) vs comm.Reduce"),
    "bcast": (run_reduction, "zcoll.bcast vs comm.Bcast"),
    "barrier": (run_reduction, "zcoll.barrier vs comm.Barrier"),
    "fft": (run_fft, "zcoll.fft.PFFT vs mpi4py_fft.PFFT (3D, forward+backward)"),
    "copy": (run_copy, "copy bandwidth: memcpy, hybrid and streaming kernels, np.copyto"),
    "crossover": (
        crossover.run_crossover,
        "copy='auto' vs each fixed copy mode and comm.Alltoall at the cache boundary",
    ),
    "alloc": (
        alloc.run_alloc,
        "allocate+free with zcoll's shared heap vs NumPy's default allocator, 64 B-1 GiB",
    ),
    "setup": (
        setup.run_setup,
        "making and freeing: a new communicator's first call vs MPI's, PFFT, Pencil and "
        "Transfer vs mpi4py-fft's",
    ),
    "cachemiss": (
        run_cachemiss,
        "simulated cache misses of the block orders (valgrind, one process; no MPI needed)",
    ),
}


def _virtual_node_size(text: str) -> int:
    try:
        k = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if k < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {k}")
    return k


def apply_virtual_nodes(k: int | None) -> None:
    """Put ``ZCOLL_VIRTUAL_NODE_SIZE=k`` in force for every zcoll context made from now on
    (nothing when `k` is None). Raises RuntimeError when a context already exists: its node
    split is made, and a bench mixing the two would compare different things."""
    if k is None:
        return
    if any(not ctx.core.closed for ctx in list(_context._live_contexts)):
        raise RuntimeError(
            "zcoll.bench: --virtual-node-size must take effect before any zcoll context exists"
        )
    os.environ["ZCOLL_VIRTUAL_NODE_SIZE"] = str(k)


class _RootParser(argparse.ArgumentParser):
    """An argument parser that prints help and errors on rank 0 only (all ranks still exit)."""

    def _print_message(self, message, file=None):
        if MPI.COMM_WORLD.rank == 0:
            super()._print_message(message, file)


def _add_output_options(parser: argparse.ArgumentParser, plot: bool = True) -> None:
    parser.add_argument(
        "--virtual-node-size",
        type=_virtual_node_size,
        metavar="K",
        help="split the ranks into virtual nodes of K ranks (COMM_WORLD rank // K), so the "
        "multi-node path runs on one machine; sets ZCOLL_VIRTUAL_NODE_SIZE before any zcoll "
        "context exists (default: the variable, else real nodes)",
    )
    output = parser.add_argument_group("output (written by rank 0)")
    output.add_argument("--json", metavar="FILE", help="write raw results and metadata as JSON")
    output.add_argument("--csv", metavar="FILE", help="write raw results as CSV")
    if plot:
        output.add_argument(
            "--plot", metavar="FILE.png", help="draw the results with matplotlib into FILE.png"
        )
    output.add_argument(
        "--no-progress",
        dest="progress",
        action="store_false",
        help="no progress bar (shown on rank 0 when a terminal is attached and tqdm installed)",
    )


def _collective_options() -> argparse.ArgumentParser:
    options = _RootParser(add_help=False)
    add_collective_options(options)
    _add_output_options(options)
    return options


def _vcollective_options() -> argparse.ArgumentParser:
    options = _RootParser(add_help=False)
    add_vcollective_options(options)
    _add_output_options(options)
    return options


def _reduction_options() -> argparse.ArgumentParser:
    options = _RootParser(add_help=False)
    add_reduction_options(options)
    _add_output_options(options)
    return options


def _fft_options() -> argparse.ArgumentParser:
    from zcoll.fft import BACKENDS

    options = _RootParser(add_help=False)
    options.add_argument(
        "--sizes",
        type=parse_fft_sizes,
        default=list(FFT_SIZES),
        metavar="N,N,...",
        help="cube edges: each N gives an N x N x N transform "
        f"(default {','.join(map(str, FFT_SIZES))})",
    )
    options.add_argument(
        "--dtype",
        choices=FFT_DTYPES,
        default="complex128",
        help="input dtype; float32/float64 give real-to-complex transforms (default complex128)",
    )
    options.add_argument(
        "--grid",
        dest="grid_text",
        default="none",
        metavar="GRID",
        help="process grid: none (library default: pencils over axes 0 and 1), slab, pencil, "
        "or counts per axis such as 2x1 or 2x2x1 (default none)",
    )
    options.add_argument(
        "--backend",
        choices=sorted(BACKENDS),
        default="numpy",
        help="zcoll's serial FFT library (default numpy)",
    )
    options.add_argument(
        "--rank",
        type=int,
        choices=(0, 1),
        default=0,
        help="0: scalar fields; 1: 3-component vector fields: zcoll transforms all components "
        "in one call (components auto, also timed fused and separate), mpi4py-fft one call per "
        "component (default 0)",
    )
    options.add_argument(
        "--mpi4py-fft-backend",
        default="fftw",
        metavar="NAME",
        help="mpi4py-fft's serial FFT backend: fftw, pyfftw, numpy, scipy, ...; "
        "none: time zcoll alone (default fftw)",
    )
    options.add_argument(
        "--mpi4py-fft-arrays",
        choices=("internal", "explicit"),
        default="internal",
        help="internal: mpi4py-fft's forward()/backward() on its own arrays, no copies; "
        "explicit: forward(u, u_hat)/backward(u_hat, u), as zcoll is called (default internal)",
    )
    options.add_argument(
        "--iterations",
        type=int,
        help="timed forward+backward pairs per round (default: --time-budget / rounds / cost "
        "of one, 3 to 1000)",
    )
    options.add_argument("--warmup", type=int, help="untimed pairs first (default 1)")
    options.add_argument(
        "--rounds",
        type=int,
        default=FFT_ROUNDS,
        help="alternating rounds: each times one loop of every library, the order reversed "
        f"every other round; the medians are reported (default {FFT_ROUNDS})",
    )
    options.add_argument(
        "--time-budget",
        type=float,
        default=FFT_TIME_BUDGET,
        metavar="SECONDS",
        help="target time of each library's loops over all rounds when --iterations is not "
        f"given; 0: {FFT_ITERATIONS} pairs per round (default {FFT_TIME_BUDGET:g})",
    )
    options.add_argument(
        "--check",
        action="store_true",
        help="first compare zcoll's forward result with mpi4py-fft's, and its round trip "
        "with the input (relative 2-norm, 1e-10; 1e-5 in single precision)",
    )
    _add_output_options(options)
    return options


def _copy_options() -> argparse.ArgumentParser:
    options = _RootParser(add_help=False)
    options.add_argument(
        "--sizes",
        type=parse_sizes,
        default=list(COPY_SIZES),
        help="bytes per copy, e.g. 4K,1M,64M (default: 4 KiB to 256 MiB in steps of 4)",
    )
    options.add_argument(
        "--threshold",
        type=parse_size,
        help="hybrid: temporal bytes at the start of each copy (default: L2 / ranks per node)",
    )
    options.add_argument(
        "--iterations", type=int, help="copies per timed loop (default: from --time-budget)"
    )
    options.add_argument("--warmup", type=int, help="untimed copies first (default 1)")
    options.add_argument(
        "--time-budget",
        type=float,
        default=COPY_TIME_BUDGET,
        metavar="SECONDS",
        help=f"timed copies per measurement, over its {COPY_LOOPS} loops, in seconds "
        f"(default {COPY_TIME_BUDGET:g})",
    )
    options.add_argument(
        "--no-check",
        dest="check",
        action="store_false",
        help="do not compare each copy with its source",
    )
    options.add_argument(
        "--no-bound",
        dest="bound",
        action="store_false",
        help="skip the out-of-cache memcpy bound (copies of max(64 MiB, 4 x L3) per rank)",
    )
    _add_output_options(options)
    return options


def _crossover_options() -> argparse.ArgumentParser:
    options = _RootParser(add_help=False)
    crossover.add_options(options)
    _add_output_options(options)
    return options


def _setup_options() -> argparse.ArgumentParser:
    options = _RootParser(add_help=False)
    setup.add_options(options)
    _add_output_options(options, plot=False)
    return options


def _alloc_options() -> argparse.ArgumentParser:
    options = _RootParser(add_help=False)
    alloc.add_options(options)
    return options


def _cachemiss_options() -> argparse.ArgumentParser:
    options = _RootParser(add_help=False)
    cachemiss.add_options(options)
    return options


#: Subcommand name -> function returning a parent parser with its options.
_OPTIONS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    ALLTOALL: _collective_options,
    ALLGATHER: _collective_options,
    **dict.fromkeys(VCOLLECTIVE_COMMANDS, _vcollective_options),
    **dict.fromkeys(REDUCTION_COMMANDS, _reduction_options),
    "fft": _fft_options,
    "copy": _copy_options,
    "crossover": _crossover_options,
    "setup": _setup_options,
    "alloc": _alloc_options,
    "cachemiss": _cachemiss_options,
}


def _parser() -> argparse.ArgumentParser:
    # Typed as a plain parser: typeshed wants add_parser's `parents` of the root's own class.
    parser: argparse.ArgumentParser = _RootParser(
        prog="python -m zcoll.bench",
        description="OSU-style latency of zcoll collectives against the MPI library's, "
        "zcoll.fft against mpi4py-fft, the cost of making and freeing communicators and plans, "
        "zcoll's copy kernels, and the simulated cache misses of its block orders.",
        epilog="Run under MPI, e.g.: mpiexec -n 8 python -m zcoll.bench alltoall",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, text) in COMMANDS.items():
        commands.add_parser(name, parents=[_OPTIONS[name]()], help=text, description=text)
    return parser


def _finish_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Checks and defaults that argparse cannot express (calls ``parser.error`` on misuse)."""
    if args.command == "cachemiss":
        cachemiss.finish_args(parser, args)
        return
    if args.command == "alloc":
        return
    if args.command == "setup":
        setup.finish_args(parser, args)
        return
    if args.command in REDUCTION_COMMANDS:
        finish_reduction_args(parser, args)
    elif args.command in VCOLLECTIVE_COMMANDS:
        finish_vcollective_args(parser, args)
    elif args.command == "crossover":
        crossover.finish_args(parser, args)
    elif args.command == "fft":
        try:
            args.grid = parse_grid(args.grid_text)
        except argparse.ArgumentTypeError as exc:
            parser.error(f"argument --grid: {exc}")
    elif args.command == "copy":
        if args.time_budget <= 0 and args.iterations is None:
            parser.error("copy needs --time-budget > 0 or --iterations")
    else:
        if args.sizes and (args.min or args.max):
            parser.error("--sizes cannot be combined with --min/--max")
        if not args.sizes:
            args.sizes = powers_of_two(args.min or 8, args.max or MIB)
            if not args.sizes:
                parser.error("no power of two lies between --min and --max")
        if args.orders is None:
            args.orders = [AUTO] if args.persistent else list(ALL_ORDERS)
        args.methods = zcoll_methods(args.orders, args.copies, args.persistent, args.buffers)
    if getattr(args, "rounds", None) is not None and args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if getattr(args, "iterations", None) is not None and args.iterations < 1:
        parser.error("--iterations must be at least 1")
    if getattr(args, "warmup", None) is not None and args.warmup < 0:
        parser.error("--warmup must be at least 0")
    if args.plot and not args.plot.lower().endswith(".png"):
        parser.error(f"--plot writes a PNG file: its name must end in .png, got {args.plot!r}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse and complete the options of ``python -m zcoll.bench`` (SystemExit(2) on misuse)."""
    parser = _parser()
    args = parser.parse_args(argv)
    _finish_args(parser, args)
    args.argv = list(argv)
    return args


def main(argv: list[str] | None = None) -> int:
    """Run ``python -m zcoll.bench COMMAND [options]``; see ``--help``.

    Collective over ``MPI.COMM_WORLD``: every rank runs it with the same arguments.

    Parameters
    ----------
    argv : list of str, optional
        Arguments after the program name; ``sys.argv[1:]`` by default.

    Returns
    -------
    int
        Exit status, the same on every rank: 0 on success, 1 if a check failed, 2 on a usage
        error (reported by rank 0; ``--help`` returns 0).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    try:  # argparse reports a usage error by raising SystemExit(2), on every rank
        args = parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    apply_virtual_nodes(getattr(args, "virtual_node_size", None))
    function, _ = COMMANDS[args.command]
    return function(MPI.COMM_WORLD, args)
