"""A distributed 3D FFT with zcoll.fft: build a field, transform it forward and back, verify, time.

Run it under MPI, with any number of ranks::

    mpiexec -n 4 python examples/fft3d.py
    mpiexec -n 4 python examples/fft3d.py --n 128 --dtype float64 --grid slab --backend pyfftw

The field is smooth (sines and cosines) plus noise seeded per plane of the global array, so it
is the same whatever the number of ranks. The script checks

* the round trip: ``backward(forward(u))`` gives ``u`` back;
* Parseval: the energy of ``u`` equals ``N^3`` times that of its (normalised) spectrum;
* for small sizes (``N <= --reference-max``, 64 by default), the spectrum against
  ``numpy.fft.fftn`` (``rfftn`` for real input) of the whole field, gathered on rank 0;

then times forward and backward calls and splits their cost into local FFTs and global
transposes (``PFFT.timings``). It exits with status 1 if any check fails on any rank.

``zcoll.fft`` has mpi4py-fft's API: replacing the import below by ``from mpi4py_fft import
PFFT, newDistArray`` (and dropping ``backend=``/``timings``) runs the same program there. The
checks' sums and maxima over the ranks go through ``zcoll.allreduce`` (shared memory, the same
bits on every rank; ``comm.allreduce`` would do too).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from mpi4py import MPI

import zcoll
from zcoll.fft import PFFT, newDistArray

comm = MPI.COMM_WORLD
rank, P = comm.rank, comm.size


def say(*args):
    """Print on rank 0 only, so the output is not repeated P times."""
    if rank == 0:
        print(*args, flush=True)


class RootParser(argparse.ArgumentParser):
    """Prints help and usage errors on rank 0 only; every rank still exits."""

    def _print_message(self, message, file=None):
        if rank == 0:
            super()._print_message(message, file)


def parse_grid(text: str):
    """none -> library default (pencils), slab -> (-1,), pencil -> (0, 0), 2x1 -> (2, 1)."""
    named = {"none": None, "slab": (-1,), "pencil": (0, 0)}
    if text in named:
        return named[text]
    try:
        return tuple(int(p) for p in text.split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a grid: {text!r}") from None


parser = RootParser(description=__doc__.split("\n")[0])
parser.add_argument("--n", type=int, default=64, help="global size N of the N^3 field (64)")
parser.add_argument(
    "--dtype",
    default="complex128",
    choices=["complex128", "float64", "complex64", "float32"],
    help="float64/float32 give real-to-complex transforms (complex128)",
)
parser.add_argument(
    "--grid", type=parse_grid, default=None, help="none, slab, pencil or e.g. 2x1 (none)"
)
parser.add_argument("--backend", default="numpy", choices=["numpy", "scipy", "pyfftw", "fftw"])
parser.add_argument("--repeat", type=int, default=10, help="timed calls of each kind (10)")
parser.add_argument(
    "--reference-max",
    type=int,
    default=64,
    metavar="N",
    help="compare with numpy.fft on the gathered field when N <= this (64)",
)
try:
    args = parser.parse_args()
except SystemExit as exc:
    sys.exit(exc.code)

N, dtype = args.n, np.dtype(args.dtype)
single = dtype in (np.dtype(np.complex64), np.dtype(np.float32))
tolerance = 1e-4 if single else 1e-10
failures = []


def check(what, error):
    """Record a check of a relative error; it passes only if it passed on every rank (the
    largest error over the ranks: zcoll.allreduce, the same bits on every rank)."""
    error = float(zcoll.allreduce(comm, np.array([error], np.float64), op="max")[0])
    ok = error <= tolerance  # False for NaN
    say(
        f"  {'ok  ' if ok else 'FAIL'} {what}: relative error {error:.2e} (tolerance {tolerance:g})"
    )
    if not ok:
        failures.append(what)


def field(local_slice):
    """This rank's part of the test field (the same global field for any decomposition)."""
    x, y, z = (2 * np.pi / N * np.arange(s.start, s.stop) for s in local_slice)
    smooth = np.sin(x)[:, None, None] * np.cos(2 * y)[None, :, None] + np.cos(3 * z)[None, None, :]
    part = np.empty(smooth.shape, dtype)
    for k, i in enumerate(range(local_slice[0].start, local_slice[0].stop)):
        rng = np.random.default_rng([12345, i])  # plane i of axis 0 always gets the same noise
        noise = rng.standard_normal((N, N))[local_slice[1:]]
        if dtype.kind == "c":
            noise = noise + 1j * rng.standard_normal((N, N))[local_slice[1:]]
        part[k] = smooth[k] + 0.1 * noise
    return part


def span(local_slice):
    """``(slice(0, 32), slice(32, 64))`` -> ``"0:32, 32:64"``."""
    return ", ".join(f"{s.start}:{s.stop}" for s in local_slice)


def total(x):
    """Sum over all ranks, through zcoll's shared-memory allreduce (in rank order: the same
    value on every rank, and from run to run)."""
    return float(zcoll.allreduce(comm, np.array([x], np.float64))[0])


# 1. The plan: collective; every rank passes the same arguments. It raises ValueError on every
#    rank if the grid cannot split N^3 (e.g. more ranks along an axis than points).
try:
    fft = PFFT(comm, (N, N, N), dtype=dtype, grid=args.grid, backend=args.backend)
except (ValueError, TypeError, ImportError) as exc:
    say(f"fft3d.py: {exc}")
    sys.exit(2)
dims = fft.subcomm.dims
kind = {0: "serial", 1: "slabs"}.get(sum(d > 1 for d in dims), "pencils")
say(
    f"zcoll.fft: {N}^3 {dtype} ({'real-to-complex' if dtype.kind == 'f' else 'complex'}) on "
    f"P={P}, grid {'x'.join(map(str, dims))} ({kind}), backend {args.backend}"
)
say(
    f"  rank 0 holds input [{span(fft.local_slice(False))}] of {fft.global_shape(False)}, "
    f"spectrum [{span(fft.local_slice(True))}] of {fft.global_shape(True)}"
)

# 2. Arrays distributed like the plan's input and output, in zcoll's shared arena.
u = newDistArray(fft, forward_output=False)
u[...] = field(fft.local_slice(False))

# 3. Forward (scaled by 1/N^3, as in mpi4py-fft) and backward (not scaled): a call without an
#    output array returns the plan's own output array (fft.forward.output_array), which the
#    next call overwrites, as in mpi4py-fft.
u_hat = fft.forward(u)
u_back = fft.backward(u_hat)

say("checks:")
energy = total(np.vdot(u, u).real)
check("backward(forward(u)) == u", np.sqrt(total(np.vdot(u_back - u, u_back - u).real) / energy))

# Parseval. For real input only half the spectrum is stored (along axis 2): the coefficients
# 0 < k < N/2 stand for k and N-k as well, so they count twice.
weights = np.ones(fft.shape(True)[2])
if dtype.kind == "f":
    k = np.arange(N // 2 + 1)[fft.local_slice(True)[2]]
    weights[(k > 0) & (2 * k < N)] = 2.0
spectral = total(np.einsum("ijk,k->", np.abs(u_hat) ** 2, weights)) * N**3
check("Parseval: sum |u|^2 == N^3 sum |u_hat|^2", abs(spectral - energy) / energy)

# Reference: the whole field and spectrum gathered on rank 0 (small N only), then numpy.fft.
if N <= args.reference_max:
    pieces = comm.gather(
        (fft.local_slice(False), np.asarray(u), fft.local_slice(True), np.asarray(u_hat)), root=0
    )
    error = 0.0
    if rank == 0:
        whole = np.empty(fft.global_shape(False), dtype)
        spectrum = np.empty(fft.global_shape(True), u_hat.dtype)
        for input_slice, input_part, output_slice, output_part in pieces:
            whole[input_slice], spectrum[output_slice] = input_part, output_part
        numpy_fft = np.fft.rfftn if dtype.kind == "f" else np.fft.fftn
        expected = numpy_fft(whole.astype(np.complex128 if dtype.kind == "c" else np.float64))
        expected /= N**3
        error = np.linalg.norm(spectrum - expected) / np.linalg.norm(expected)
    error = zcoll.bcast(comm, np.array([error], np.float64), root=0)[0]
    check("forward(u) == numpy.fft of the gathered field", error)
else:
    say(f"  (numpy.fft reference skipped: N={N} > --reference-max {args.reference_max})")

# 4. Timing. With output arrays given, no call allocates; fft.timings accumulates the seconds
#    spent in local FFTs and in global transposes (on this rank).
out_hat = newDistArray(fft, forward_output=True)
out = newDistArray(fft, forward_output=False)
calls = f"{args.repeat} call{'s' * (args.repeat != 1)} each"
say(f"timing per call ({calls}, max over ranks of the per-rank mean):")
say(f"  {'':10}{'total':>10}{'local FFTs':>13}{'transposes':>13}{'other':>10}")
for name, call, source, target in (
    ("forward", fft.forward, u, out_hat),
    ("backward", fft.backward, u_hat, out),
):
    for _ in range(3):  # warm-up: pyfftw makes its plans here, and the ranks settle in step
        call(source, target)
    fft.reset_timings()
    comm.Barrier()
    start = MPI.Wtime()
    for _ in range(args.repeat):
        call(source, target)
    elapsed = MPI.Wtime() - start
    times = np.array([elapsed, fft.timings["fft"], fft.timings["transpose"]]) / args.repeat
    zcoll.allreduce(comm, zcoll.IN_PLACE, times, op="max")
    seconds, ffts, transposes = times
    other = max(seconds - ffts - transposes, 0.0)
    say(
        f"  {name:10}{seconds * 1e3:8.2f} ms{ffts * 1e3:10.2f} ms{transposes * 1e3:10.2f} ms"
        f"{other * 1e3:7.2f} ms"
    )

fft.destroy()
if failures:
    say(f"FAILED: {', '.join(failures)}")
    sys.exit(1)
say("all checks passed")
