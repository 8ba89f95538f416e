"""The heat equation, explicit, on a Cartesian communicator: ghost exchange with zcoll.

Run it under MPI, with any number of ranks::

    mpiexec -n 4 python examples/heat.py                  # 2D, 360 x 600 points
    mpiexec -n 4 python examples/heat.py --dim 3          # 3D, 48 x 64 x 96 points
    mpiexec -n 4 python examples/heat.py --mpi            # mpi4py's Neighbor_alltoallv instead
    mpiexec -n 4 python examples/heat.py --compare        # both in one launch, side by side

``u_t = D lap(u)`` on the box ``[0, L_0] x [0, L_1] (x [0, L_2])`` with ``u = 0`` on its
boundary (Dirichlet), on a grid of ``n_0 x n_1 (x n_2)`` interior points of spacing ``h``
(``L_i = (n_i + 1) h``), advanced with forward Euler and the second-order central Laplacian.
The grid is cut into blocks over a process grid from ``MPI.Compute_dims`` (or ``--dims``) on a
non-periodic Cartesian communicator, as the heat-transfer application of Li et al. (TPDS 2018,
section 4.4: 60 processes as 6 x 10) is; each rank holds its block with one layer of ghost
points around it.

Each step exchanges the ghost layers with one ``zcoll.neighbor_alltoallv`` on the Cartesian
communicator: the faces of the block are packed into a send buffer in MPI's neighbour order
(per dimension, the face toward the negative neighbour, then the one toward the positive
neighbour), whose blocks have different lengths per dimension (the faces of a non-cubic
block); the receive buffer, in the same order, is unpacked into the ghost layers. At the
boundary of the domain the neighbour is ``MPI.PROC_NULL``: nothing arrives and the ghost layer
keeps the boundary value 0. Both buffers are zcoll arena arrays (``zcoll.empty``), so the
exchange copies each face once, from the sender's buffer into the receiver's. The exchange is a
persistent plan (``zcoll.neighbor_alltoallv_init``, made once: counts checked and copies
resolved at creation, each step two node barriers and the copies); ``--no-plan`` calls
``zcoll.neighbor_alltoallv`` every step instead. The residual
``||u^{n+1} - u^n||_2`` is summed over the ranks with ``zcoll.allreduce``. ``--mpi`` runs the
same program on mpi4py alone (``comm.Neighbor_alltoallv`` on NumPy arrays, ``comm.Allreduce``);
``--compare`` runs both in one launch, their steps interleaved (so that both see the machine
alike), checks that they compute the same field bit for bit, and prints the ratios of their
times.

The initial condition is a sum of two separable modes, ``u0 = sum_m a_m prod_i
sin(pi k_mi x_i / L_i)``, so the solution is known in closed form twice:

* the heat equation's: each mode decays as ``exp(-D pi^2 sum_i (k_mi / L_i)^2 t)``; the scheme
  differs from it by ``O(h^2 + dt)``, and the check's tolerance is the leading term of that
  error, ``T (D h^2 / 12 sum_i (pi k_mi / L_i)^4 + dt mu_m^2 / 2)`` per mode;
* the scheme's own: the sampled modes are eigenvectors of the discrete Laplacian, so forward
  Euler multiplies mode m by exactly ``g_m = 1 - 4 D dt / h^2 sum_i sin^2(pi k_mi h / (2
  L_i))`` per step. The computed field must match ``sum_m a_m g_m^n`` times the modes to
  rounding (relative 1e-12 or so): a ghost value that is wrong, stale or misplaced in any
  step shows up here. The final residual is checked against its closed form too.

It prints the time per step split into compute (the stencil and the local residual) and
exchange (pack, the collective, unpack), and the allreduce, each the slowest rank's mean; and
exits with status 1 if a check fails on any rank.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time

import numpy as np
from mpi4py import MPI

import zcoll

ZCOLL, MPI4PY = "zcoll", "mpi4py"
#: The initial condition: (amplitude, wavenumber per axis) of each separable mode.
MODES = {2: ((1.0, (1, 1)), (0.5, (2, 3))), 3: ((1.0, (1, 1, 1)), (0.5, (2, 3, 1)))}
DEFAULT_N = {2: (360, 600), 3: (48, 64, 96)}
PHASES = ("compute", "pack", "collective", "unpack", "allreduce")


def say(comm: MPI.Comm, *args) -> None:
    """Print on rank 0 only, so the output is not repeated P times."""
    if comm.rank == 0:
        print(*args, flush=True)


def parse_shape(text: str) -> tuple[int, ...]:
    """``"360x600"`` -> (360, 600); ``"64"`` -> (64,), every axis."""
    try:
        shape = tuple(int(p) for p in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a shape: {text!r} (e.g. 360x600)") from None
    if not shape or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"not a shape: {text!r} (positive sizes)")
    return shape


@dataclasses.dataclass(frozen=True)
class Problem:
    """The discretised problem: grid, time step, initial condition, on every rank alike."""

    n: tuple[int, ...]  # interior points per axis
    steps: int
    cfl: float = 0.8  # dt as a fraction of the stability limit h^2 / (2 dim D)
    diffusivity: float = 1.0

    @property
    def dim(self) -> int:
        return len(self.n)

    @property
    def h(self) -> float:
        """Grid spacing, the same on every axis: the longest side has length 1."""
        return 1.0 / (max(self.n) + 1)

    @property
    def lengths(self) -> tuple[float, ...]:
        return tuple((m + 1) * self.h for m in self.n)

    @property
    def dt(self) -> float:
        return self.cfl * self.h**2 / (2 * self.dim * self.diffusivity)

    @property
    def r(self) -> float:
        """``D dt / h^2``: the stencil's weight of a neighbour."""
        return self.diffusivity * self.dt / self.h**2

    @property
    def modes(self):
        return MODES[self.dim]

    def growth(self, k) -> float:
        """Forward Euler's factor per step for the discrete mode `k`: exact for the scheme."""
        angles = (math.pi * ki * self.h / (2 * length) for ki, length in zip(k, self.lengths))
        return 1.0 - 4.0 * self.r * sum(math.sin(a) ** 2 for a in angles)

    def decay_rate(self, k) -> float:
        """``mu = D pi^2 sum_i (k_i / L_i)^2``: the heat equation's mode decays as exp(-mu t)."""
        return self.diffusivity * sum((math.pi * ki / li) ** 2 for ki, li in zip(k, self.lengths))

    def truncation(self, k, t: float) -> float:
        """Leading-order relative error of the scheme's mode `k` at time `t` against the heat
        equation's: ``t (D h^2 / 12 sum_i (pi k_i / L_i)^4 + dt mu^2 / 2)`` (the two terms have
        opposite signs, so their sum bounds the error)."""
        space = sum((math.pi * ki / li) ** 4 for ki, li in zip(k, self.lengths))
        space *= self.diffusivity * self.h**2 / 12
        time_ = self.dt * self.decay_rate(k) ** 2 / 2
        return math.expm1(t * (space + time_))

    def mode_norm2(self) -> float:
        """``||phi||_2^2`` of a sampled mode: ``prod_i (n_i + 1) / 2`` (any wavenumbers)."""
        return math.prod((m + 1) / 2 for m in self.n)


def split(n: int, parts: int, index: int) -> slice:
    """The block of `n` points that part `index` of `parts` holds (the first n % parts hold one
    more)."""
    start = index * (n // parts) + min(index, n % parts)
    return slice(start, start + n // parts + (index < n % parts))


class Block:
    """This rank's block of the global grid, with one ghost layer on every side."""

    def __init__(self, cart: MPI.Cartcomm, problem: Problem) -> None:
        dims, coords = cart.dims, cart.coords
        self.global_slice = tuple(split(m, d, c) for m, d, c in zip(problem.n, dims, coords))
        self.shape = tuple(s.stop - s.start for s in self.global_slice)
        self.interior = tuple(slice(1, m + 1) for m in self.shape)
        self.problem = problem

    def mode(self, k) -> np.ndarray:
        """The sampled mode ``prod_i sin(pi k_i x_i / L_i)`` on this block's interior."""
        p = self.problem
        factors = [
            np.sin(math.pi * ki * np.arange(s.start + 1, s.stop + 1) / (m + 1))
            for ki, s, m in zip(k, self.global_slice, p.n)
        ]
        out = factors[0]
        for f in factors[1:]:
            out = np.multiply.outer(out, f)
        return out

    def field(self, factors) -> np.ndarray:
        """``sum_m factors[m] a_m phi_m`` on the interior."""
        total = np.zeros(self.shape)
        for factor, (amplitude, k) in zip(factors, self.problem.modes):
            total += factor * amplitude * self.mode(k)
        return total


class GhostExchange:
    """One ``neighbor_alltoallv`` that fills the ghost layers of a block from its neighbours.

    The send buffer holds the block's faces in MPI's neighbour order of a Cartesian
    communicator: for dimension 0, the face toward the negative neighbour (the first interior
    layer along axis 0), then the face toward the positive neighbour (the last), then the same
    for dimension 1, ... The receive buffer has the same layout: block 2i came from the
    negative neighbour along axis i (its last layer: our ghost layer 0), block 2i + 1 from the
    positive one. Counts and displacements are in float64 elements, each face's size.
    """

    def __init__(
        self,
        cart: MPI.Cartcomm,
        block: Block,
        library: str,
        order: str,
        arena: bool = True,
        persistent: bool = True,
    ) -> None:
        shape, dim = block.shape, len(block.shape)
        self.neighbours = []
        for axis in range(dim):
            negative, positive = cart.Shift(axis, 1)
            self.neighbours += [negative, positive]
        faces = []  # (interior layer sent, ghost layer received) per neighbour, in MPI's order
        for axis in range(dim):
            for inner, ghost in ((1, 0), (shape[axis], shape[axis] + 1)):
                sent, received = list(block.interior), list(block.interior)
                sent[axis], received[axis] = inner, ghost
                faces.append((tuple(sent), tuple(received)))
        face_shapes = [tuple(m for i, m in enumerate(shape) if i != axis) for axis in range(dim)]
        counts = [math.prod(face_shapes[j // 2]) for j in range(2 * dim)]
        displs = [sum(counts[:j]) for j in range(2 * dim)]
        total = sum(counts)
        if library == ZCOLL:
            if arena:  # in the node's shared arena: no staging copy
                self.send = zcoll.empty(cart, total, np.float64)
                self.recv = zcoll.empty(cart, total, np.float64)
            else:  # plain NumPy arrays: zcoll stages them, one more copy each side
                self.send, self.recv = np.empty(total), np.empty(total)
            send_spec = [self.send, (counts, displs)]
            recv_spec = [self.recv, (counts, displs)]
            if persistent:  # counts, checks and copies settled once: a run is two barriers
                self.collective = zcoll.neighbor_alltoallv_init(
                    cart, send_spec, recv_spec, order=order
                )
            else:
                self.collective = lambda: zcoll.neighbor_alltoallv(
                    cart, send_spec, recv_spec, order=order
                )
        else:
            self.send, self.recv = np.empty(total), np.empty(total)
            send_spec = [self.send, (counts, displs), MPI.DOUBLE]
            recv_spec = [self.recv, (counts, displs), MPI.DOUBLE]
            self.collective = lambda: cart.Neighbor_alltoallv(send_spec, recv_spec)
        self.counts, self.displs = counts, displs
        views = [
            (
                self.send[d : d + c].reshape(face_shapes[j // 2]),
                self.recv[d : d + c].reshape(face_shapes[j // 2]),
            )
            for j, (c, d) in enumerate(zip(counts, displs))
        ]
        self.packs = [(sview, sent) for (sview, _), (sent, _) in zip(views, faces)]
        self.unpacks = [
            (ghost, rview)
            for (_, rview), (_, ghost), rank in zip(views, faces, self.neighbours)
            if rank != MPI.PROC_NULL
        ]

    def pack(self, u: np.ndarray) -> None:
        for view, face in self.packs:
            np.copyto(view, u[face])

    def unpack(self, u: np.ndarray) -> None:
        for ghost, view in self.unpacks:
            np.copyto(u[ghost], view)

    def __call__(self, u: np.ndarray, seconds: dict[str, float]) -> None:
        t0 = time.perf_counter()
        self.pack(u)
        t1 = time.perf_counter()
        self.collective()
        t2 = time.perf_counter()
        self.unpack(u)
        t3 = time.perf_counter()
        seconds["pack"] += t1 - t0
        seconds["collective"] += t2 - t1
        seconds["unpack"] += t3 - t2


class Stencil:
    """``out = u + r sum_axes (u[i-1] - 2 u[i] + u[i+1])`` on the interior, and the local part
    of the residual ``sum (out - u)^2``."""

    def __init__(self, block: Block, r: float) -> None:
        self.r, self.centre = r, 1.0 - 2 * len(block.shape) * r
        inner = block.interior
        self.c = inner
        self.sides = []
        for axis in range(len(inner)):
            for shift in (-1, 1):
                side = list(inner)
                side[axis] = slice(inner[axis].start + shift, inner[axis].stop + shift)
                self.sides.append(tuple(side))
        self.tmp = np.empty(block.shape)

    def __call__(self, u: np.ndarray, out: np.ndarray) -> float:
        c, tmp = self.c, self.tmp
        np.copyto(tmp, u[self.sides[0]])
        for side in self.sides[1:]:
            tmp += u[side]
        tmp *= self.r
        new = out[c]
        np.multiply(u[c], self.centre, out=new)
        new += tmp
        np.subtract(new, u[c], out=tmp)
        return float(np.vdot(tmp, tmp))


@dataclasses.dataclass
class Result:
    """What one run computed: this rank's final interior, the checks, the time per step."""

    library: str
    field: np.ndarray
    residual: float  # ||u^S - u^(S-1)||_2, global (0 for 0 steps)
    errors: dict[str, float] = dataclasses.field(default_factory=dict)  # check -> relative error
    tolerances: dict[str, float] = dataclasses.field(default_factory=dict)
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)  # phase -> s/step

    @property
    def failed(self) -> list[str]:
        return [k for k, e in self.errors.items() if not e <= self.tolerances[k]]  # NaN fails

    @property
    def exchange(self) -> float:
        return sum(self.seconds[k] for k in ("pack", "collective", "unpack"))

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


def make_cart(comm: MPI.Comm, problem: Problem, dims=None) -> MPI.Cartcomm:
    """A non-periodic Cartesian communicator over `comm` (dims from MPI.Compute_dims)."""
    dims = list(dims) if dims else MPI.Compute_dims(comm.size, problem.dim)
    if len(dims) != problem.dim or math.prod(dims) != comm.size:
        raise ValueError(f"process grid {dims} does not fit {comm.size} ranks in {problem.dim}D")
    if any(d > m for d, m in zip(dims, problem.n)):
        raise ValueError(
            f"process grid {'x'.join(map(str, dims))} has more ranks than points "
            f"({'x'.join(map(str, problem.n))}) along an axis"
        )
    return comm.Create_cart(dims, periods=[False] * problem.dim, reorder=False)


class Reductions:
    """Sums and maxima over the ranks: zcoll's shared-memory allreduce, or mpi4py's."""

    def __init__(self, cart: MPI.Comm, library: str) -> None:
        self.cart, self.zcoll = cart, library == ZCOLL

    def __call__(self, values, op: str = "sum") -> np.ndarray:
        values = np.asarray(values, np.float64)
        if self.zcoll:
            return zcoll.allreduce(self.cart, values, op=op)
        out = np.empty_like(values)
        self.cart.Allreduce(values, out, op=MPI.SUM if op == "sum" else MPI.MAX)
        return out


class Solver:
    """The problem set up on `comm` (collective) with `library`'s ghost exchange and allreduce,
    advanced one step at a time (:meth:`step`), so that ``--compare`` can interleave two.

    zcoll's exchange buffers are arena arrays, or with ``arena=False`` plain NumPy arrays
    (staged). `warmup` exchanges come first, untimed (they leave the field as it is). The
    residual is reduced every `residual_every` steps and after the last.
    """

    def __init__(
        self,
        comm: MPI.Comm,
        problem: Problem,
        library: str = ZCOLL,
        *,
        dims=None,
        order: str = "auto",
        arena: bool = True,
        persistent: bool = True,
        warmup: int = 3,
        residual_every: int = 1,
    ) -> None:
        self.problem, self.library, self.residual_every = problem, library, residual_every
        self.cart = make_cart(comm, problem, dims)
        self.block = Block(self.cart, problem)
        self.exchange = GhostExchange(self.cart, self.block, library, order, arena, persistent)
        self.stencil = Stencil(self.block, problem.r)
        self.reduce = Reductions(self.cart, library)
        self.u = np.zeros(tuple(m + 2 for m in self.block.shape))  # ghosts 0: the boundary
        self.u_next = np.zeros_like(self.u)
        self.u[self.block.interior] = self.block.field([1.0] * len(problem.modes))
        for _ in range(warmup):
            self.exchange(self.u, dict.fromkeys(PHASES, 0.0))
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.residual = 0.0

    def step(self, step: int) -> bool:
        """Advance from step ``step - 1`` to `step`; True if the residual was reduced."""
        self.exchange(self.u, self.seconds)
        t0 = time.perf_counter()
        local = self.stencil(self.u, self.u_next)
        t1 = time.perf_counter()
        self.seconds["compute"] += t1 - t0
        self.u, self.u_next = self.u_next, self.u
        if step % self.residual_every and step != self.problem.steps:
            return False
        self.residual = math.sqrt(float(self.reduce([local])[0]))
        self.seconds["allreduce"] += time.perf_counter() - t1
        return True

    def finish(self, check: bool = True) -> Result:
        """The result (times per step: the slowest rank's); with `check`, compared with the
        closed forms. Frees the communicator (collective)."""
        steps = max(self.problem.steps, 1)
        slowest = self.reduce([self.seconds[k] / steps for k in PHASES], op="max")
        result = Result(
            self.library,
            self.u[self.block.interior].copy(),
            self.residual,
            seconds=dict(zip(PHASES, slowest)),
        )
        if check:
            checks(result, self.block, self.reduce)
        self.cart.Free()
        return result


def solve(comm: MPI.Comm, problem: Problem, library: str = ZCOLL, *, check=True, **options):
    """Run `problem` on `comm` with `library` (see :class:`Solver` for the `options`)."""
    return run([Solver(comm, problem, library, **options)], check=check)[0]


def run(solvers: list[Solver], *, log_every: int = 0, check: bool = True) -> list[Result]:
    """Advance every solver through all steps, interleaved: each step of each in turn (the
    first one first in odd steps, last in even ones), so that they share the machine's state
    alike; with `log_every`, rank 0 prints the first solver's residual every so many steps."""
    first, problem = solvers[0], solvers[0].problem
    first.cart.Barrier()
    for step in range(1, problem.steps + 1):
        for solver in solvers if step % 2 else solvers[::-1]:
            reduced = solver.step(step)
            if solver is first and reduced and log_every:
                if step % log_every == 0 or step == problem.steps:
                    residual = first.residual
                    say(first.cart, f"{step:8d} {step * problem.dt:12.6e} {residual:14.6e}")
    return [solver.finish(check) for solver in solvers]


def checks(result: Result, block: Block, reduce: Reductions) -> None:
    """The final field against the scheme's exact solution and the heat equation's, the final
    residual against its closed form (relative errors, max norm over the ranks)."""
    p, steps = block.problem, block.problem.steps
    growth = [p.growth(k) for _, k in p.modes]
    t = steps * p.dt
    discrete = block.field([g**steps for g in growth])
    continuous = block.field([math.exp(-p.decay_rate(k) * t) for _, k in p.modes])
    local = [
        float(np.abs(result.field - discrete).max(initial=0.0)),
        float(np.abs(discrete).max(initial=0.0)),
        float(np.abs(result.field - continuous).max(initial=0.0)),
        float(np.abs(continuous).max(initial=0.0)),
    ]
    d_err, d_max, c_err, c_max = reduce(local, op="max")
    eps = np.finfo(np.float64).eps
    result.errors["scheme"] = d_err / d_max
    result.tolerances["scheme"] = 16 * eps * (steps + 1) * math.sqrt(p.dim)
    # Each mode's error against the heat equation, weighted by its size at time t.
    bound = sum(abs(a) * math.exp(-p.decay_rate(k) * t) * p.truncation(k, t) for a, k in p.modes)
    result.errors["heat equation"] = c_err / c_max
    result.tolerances["heat equation"] = 1.1 * bound / c_max + 1e-12
    if steps:
        # u^S - u^(S-1) = sum_m a_m g_m^(S-1) (g_m - 1) phi_m; the modes are orthogonal.
        exact = math.sqrt(
            sum((a * g ** (steps - 1) * (g - 1)) ** 2 for (a, _), g in zip(p.modes, growth))
            * p.mode_norm2()
        )
        # The difference of two nearly equal fields: their rounding, relative to |g - 1|.
        smallest = min(abs(g - 1) for g in growth)
        result.errors["residual"] = abs(result.residual - exact) / exact
        result.tolerances["residual"] = max(64 * eps / smallest, result.tolerances["scheme"])


# --- the command line --------------------------------------------------------------------------


class RootParser(argparse.ArgumentParser):
    """Prints help and usage errors on rank 0 only; every rank still exits."""

    def _print_message(self, message, file=None):
        if MPI.COMM_WORLD.rank == 0:
            super()._print_message(message, file)


def parse_args(argv) -> argparse.Namespace:
    parser = RootParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, choices=(2, 3), default=2, help="2D or 3D (2)")
    parser.add_argument(
        "--n",
        type=parse_shape,
        help="interior points, e.g. 360x600 or 48x64x96; one number: every axis "
        "(default 360x600 in 2D, 48x64x96 in 3D)",
    )
    parser.add_argument("--steps", type=int, default=200, help="time steps (200)")
    parser.add_argument(
        "--cfl", type=float, default=0.8, help="dt / stability limit h^2/(2 dim D) (0.8)"
    )
    parser.add_argument(
        "--dims", type=parse_shape, help="process grid, e.g. 2x2 (default MPI.Compute_dims)"
    )
    parser.add_argument("--order", default="auto", help="zcoll's block order (auto)")
    parser.add_argument(
        "--no-plan",
        action="store_true",
        help="zcoll: call neighbor_alltoallv every step instead of running a persistent plan "
        "(neighbor_alltoallv_init; mpi4py has no persistent neighbourhood call on Open MPI 4)",
    )
    parser.add_argument(
        "--private",
        action="store_true",
        help="zcoll on plain NumPy exchange buffers (staged: one more copy) instead of arena ones",
    )
    parser.add_argument("--warmup", type=int, default=3, help="untimed ghost exchanges first (3)")
    parser.add_argument(
        "--residual-every",
        type=int,
        default=1,
        metavar="K",
        help="reduce the residual every K steps (1)",
    )
    parser.add_argument(
        "--log", type=int, default=0, metavar="K", help="print the residual every K steps"
    )
    library = parser.add_mutually_exclusive_group()
    library.add_argument(
        "--mpi",
        action="store_true",
        help="mpi4py alone: comm.Neighbor_alltoallv on NumPy arrays, comm.Allreduce",
    )
    library.add_argument(
        "--compare",
        action="store_true",
        help="run zcoll and mpi4py, steps interleaved; check they agree bit for bit; print "
        "the ratios of their times",
    )
    parser.add_argument(
        "--check",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="compare with the closed-form solutions (default on)",
    )
    args = parser.parse_args(argv)
    if args.n is None:
        args.n = DEFAULT_N[args.dim]
    elif len(args.n) == 1:
        args.n = args.n * args.dim
    if len(args.n) != args.dim:
        parser.error(f"--n {'x'.join(map(str, args.n))} is not {args.dim}D")
    if args.dims is not None and len(args.dims) != args.dim:
        parser.error(f"--dims {'x'.join(map(str, args.dims))} is not {args.dim}D")
    if args.steps < 0 or args.warmup < 0 or args.residual_every < 1 or not 0 < args.cfl <= 1:
        parser.error("need --steps >= 0, --warmup >= 0, --residual-every >= 1, 0 < --cfl <= 1")
    return args


LABELS = {
    ZCOLL: "zcoll.neighbor_alltoallv",
    MPI4PY: "comm.Neighbor_alltoallv",
}


def times(numerator: float, denominator: float) -> str:
    """``"1.85x"``, or ``"n/a"`` when nothing was timed."""
    return f"{numerator / denominator:.2f}x" if denominator > 0 else "n/a"


def report(comm: MPI.Comm, results: list[Result]) -> None:
    say(comm, "per step (ms, slowest rank's mean of each phase):")
    say(
        comm,
        f"  {'':26}{'total':>9}{'compute':>9}{'exchange':>10}{'pack':>8}{'collective':>12}"
        f"{'unpack':>8}{'allreduce':>11}",
    )
    for r in results:
        ms = {k: v * 1e3 for k, v in r.seconds.items()}
        say(
            comm,
            f"  {LABELS[r.library]:26}{r.total * 1e3:9.3f}{ms['compute']:9.3f}"
            f"{r.exchange * 1e3:10.3f}{ms['pack']:8.3f}{ms['collective']:12.3f}"
            f"{ms['unpack']:8.3f}{ms['allreduce']:11.3f}",
        )


def main(argv=None, comm: MPI.Comm | None = None) -> int:
    """Run the example (collective over `comm`, COMM_WORLD by default); 0 if every check
    passed, 1 if one failed, 2 on a usage error."""
    comm = MPI.COMM_WORLD if comm is None else comm
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    problem = Problem(tuple(args.n), args.steps, args.cfl)
    libraries = [ZCOLL, MPI4PY] if args.compare else [MPI4PY if args.mpi else ZCOLL]
    dims = args.dims or MPI.Compute_dims(comm.size, problem.dim)
    say(
        comm,
        f"heat equation {'x'.join(map(str, problem.n))} ({problem.dim}D, Dirichlet), "
        f"P={comm.size} as {'x'.join(map(str, dims))}, {problem.steps} steps of "
        f"dt={problem.dt:.3e} (h={problem.h:.3e}, cfl {problem.cfl:g}), "
        f"{' and '.join(LABELS[lib] for lib in libraries)}",
    )
    if args.log:
        say(comm, f"{LABELS[libraries[0]]}:\n{'step':>8} {'t':>12} {'residual':>14}")
    options = dict(
        dims=dims,
        order=args.order,
        arena=not args.private,
        persistent=not args.no_plan,
        warmup=args.warmup,
    )
    try:
        solvers = [
            Solver(comm, problem, library, residual_every=args.residual_every, **options)
            for library in libraries
        ]
    except ValueError as exc:
        say(comm, f"heat.py: {exc}")
        return 2
    results = run(solvers, log_every=args.log, check=args.check)
    failures = []
    if args.check:
        say(comm, "checks (relative errors, max norm):")
        for r in results:
            for name, error in r.errors.items():
                ok = error <= r.tolerances[name]
                say(
                    comm,
                    f"  {'ok  ' if ok else 'FAIL'} {LABELS[r.library]}: {name}: {error:.2e} "
                    f"(tolerance {r.tolerances[name]:.1e})",
                )
                if not ok:
                    failures.append(f"{r.library} {name}")
    if len(results) == 2:
        same = bool(np.array_equal(results[0].field, results[1].field))
        same = comm.allreduce(same, op=MPI.LAND)
        say(
            comm,
            f"  {'ok  ' if same else 'FAIL'} zcoll and mpi4py give the same field, bit for bit",
        )
        if not same:
            failures.append("zcoll == mpi4py")
    say(comm, f"final residual ||u^n - u^(n-1)||_2: {results[0].residual:.6e}")
    report(comm, results)
    if len(results) == 2:
        z, m = results
        ratios = {
            "exchange": (m.exchange, z.exchange),
            "collective alone": (m.seconds["collective"], z.seconds["collective"]),
            "allreduce": (m.seconds["allreduce"], z.seconds["allreduce"]),
            "step": (m.total, z.total),
        }
        text = ", ".join(f"{k} {times(*v)}" for k, v in ratios.items())
        say(comm, f"mpi4py / zcoll per step (above 1: zcoll is faster): {text}")
    if failures:
        say(comm, f"FAILED: {', '.join(failures)}")
        return 1
    say(comm, "all checks passed" if args.check else "(no checks: --no-check)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
