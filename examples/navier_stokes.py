"""Taylor-Green vortex: a pseudo-spectral Navier-Stokes solver on zcoll.fft vector fields.

Run it under MPI, with any number of ranks::

    mpiexec -n 2 python examples/navier_stokes.py --n 64 --steps 10
    mpiexec -n 2 python examples/navier_stokes.py --n 64 --steps 10 --mpi4py-fft

The incompressible Navier-Stokes equations in rotational form on the periodic box
[0, 2 pi)^3, velocity ``u`` in spectral space, advanced with the classical 4-stage Runge-Kutta
method; the nonlinear term ``u x curl(u)`` is computed in physical space (optionally dealiased
with the 3/2 rule, ``--dealias``) and the pressure projected out with the wavenumbers.

With zcoll.fft every velocity and vorticity field is one rank-1 ``DistArray`` (3 components),
and each ``forward``/``backward`` moves all three components through one fused transpose per
stage. ``--mpi4py-fft`` runs the same solver on mpi4py-fft (one transform per component, as its
own example does): the printed energies agree to round-off.

Each step prints the kinetic energy ``E = <u.u>/2`` and the dissipation ``eps = nu <w.w>``
(``w = curl u``); at the end the time per step split into serial FFTs, transposes and the rest.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD


def say(*args) -> None:
    if comm.rank == 0:
        print(*args, flush=True)


class Timed:
    """Adds the seconds each call of `fn` takes to ``timings[key]`` (mpi4py-fft's split)."""

    def __init__(self, fn, timings: dict[str, float], key: str) -> None:
        self._fn, self._timings, self._key = fn, timings, key

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return self._fn(*args, **kwargs)
        finally:
            self._timings[self._key] += time.perf_counter() - t0

    def __getattr__(self, name):
        return getattr(self._fn, name)


class Fields:
    """The transforms the solver needs, on zcoll.fft (vector fields) or on mpi4py-fft."""

    def __init__(self, n: int, backend: str, dealias: bool, use_mpi4py_fft: bool) -> None:
        if use_mpi4py_fft:
            from mpi4py_fft import PFFT, newDistArray
        else:
            from zcoll.fft import PFFT, newDistArray
        self.vector = not use_mpi4py_fft
        self.new = newDistArray
        shape = (n, n, n)
        self.fft = PFFT(comm, shape, dtype=float, backend=backend)
        self.pad = (
            PFFT(comm, shape, dtype=float, backend=backend, padding=[1.5] * 3)
            if dealias
            else self.fft
        )
        if use_mpi4py_fft:
            self.timings = {"fft": 0.0, "transpose": 0.0}
            for plan in {id(p): p for p in (self.fft, self.pad)}.values():
                for t in (plan.forward, plan.backward):
                    t._xfftn = tuple(Timed(f, self.timings, "fft") for f in t._xfftn)
                    t._transfer = tuple(Timed(f, self.timings, "transpose") for f in t._transfer)
        else:
            self.timings = None

    def split(self) -> dict[str, float]:
        if self.timings is not None:
            return dict(self.timings)
        plans = {id(p): p for p in (self.fft, self.pad)}.values()
        return {k: sum(p.timings[k] for p in plans) for k in ("fft", "transpose")}

    def forward(self, plan, u, u_hat):
        if self.vector:
            return plan.forward(u, u_hat)
        for i in range(u.shape[0]):
            plan.forward(u[i], u_hat[i])
        return u_hat

    def backward(self, plan, u_hat, u):
        if self.vector:
            return plan.backward(u_hat, u)
        for i in range(u.shape[0]):
            plan.backward(u_hat[i], u[i])
        return u

    def destroy(self) -> None:
        if self.pad is not self.fft:
            self.pad.destroy()
        self.fft.destroy()


def wavenumbers(fft) -> list[np.ndarray]:
    """This rank's wavenumbers k_x, k_y, k_z (broadcastable to the spectral local shape)."""
    n = fft.global_shape(False)
    k = [np.fft.fftfreq(m, 1.0 / m) for m in n[:-1]] + [np.fft.rfftfreq(n[-1], 1.0 / n[-1])]
    local = [ki[s] for ki, s in zip(k, fft.local_slice(True))]
    return np.meshgrid(*local, indexing="ij", sparse=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=64, help="grid points per axis")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--dt", type=float, default=0.01)
    parser.add_argument("--nu", type=float, default=0.000625, help="viscosity")
    parser.add_argument("--backend", default="numpy", help="serial FFT backend (both libraries)")
    parser.add_argument("--dealias", action="store_true", help="3/2-rule padding of the products")
    parser.add_argument("--mpi4py-fft", action="store_true", help="run on mpi4py-fft instead")
    args = parser.parse_args(argv)

    f = Fields(args.n, args.backend, args.dealias, args.mpi4py_fft)
    fft, pad = f.fft, f.pad
    u = f.new(fft, False, rank=1)
    u_hat = f.new(fft, True, rank=1)
    u_hat0, u_hat1, rhs = (f.new(fft, True, rank=1) for _ in range(3))
    u_pad = f.new(pad, False, rank=1)
    w_pad = f.new(pad, False, rank=1)
    w = f.new(fft, False, rank=1)
    kx, ky, kz = wavenumbers(fft)
    k = [kx, ky, kz]
    k2 = kx * kx + ky * ky + kz * kz
    k_over_k2 = [ki / np.where(k2 == 0, 1, k2) for ki in k]

    x = [s * 2 * np.pi / args.n for s in np.ogrid[fft.local_slice(False)]]
    u[0] = np.sin(x[0]) * np.cos(x[1]) * np.cos(x[2])
    u[1] = -np.cos(x[0]) * np.sin(x[1]) * np.cos(x[2])
    u[2] = 0
    f.forward(fft, u, u_hat)
    points = float(args.n) ** 3

    def curl(v_hat, out, plan):
        w_hat = np.empty_like(v_hat)
        w_hat[0] = 1j * (k[1] * v_hat[2] - k[2] * v_hat[1])
        w_hat[1] = 1j * (k[2] * v_hat[0] - k[0] * v_hat[2])
        w_hat[2] = 1j * (k[0] * v_hat[1] - k[1] * v_hat[0])
        return f.backward(plan, w_hat, out)

    def right_hand_side(v_hat, out):
        f.backward(pad, v_hat, u_pad)
        curl(v_hat, w_pad, pad)
        cross = np.empty_like(u_pad)
        cross[0] = u_pad[1] * w_pad[2] - u_pad[2] * w_pad[1]
        cross[1] = u_pad[2] * w_pad[0] - u_pad[0] * w_pad[2]
        cross[2] = u_pad[0] * w_pad[1] - u_pad[1] * w_pad[0]
        f.forward(pad, cross, out)
        p_hat = sum(out[i] * k_over_k2[i] for i in range(3))
        for i in range(3):
            out[i] -= p_hat * k[i] + args.nu * k2 * v_hat[i]
        return out

    def diagnostics() -> tuple[float, float]:
        f.backward(fft, u_hat, u)
        curl(u_hat, w, fft)
        local = np.array([np.sum(u * u), np.sum(w * w)])
        total = np.empty_like(local)
        comm.Allreduce(local, total)
        return 0.5 * total[0] / points, args.nu * total[1] / points

    library = "mpi4py-fft" if args.mpi4py_fft else "zcoll.fft"
    say(f"# Taylor-Green vortex, N = {args.n}, P = {comm.size}, {library}, backend {args.backend}"
        f"{', 3/2 dealiasing' if args.dealias else ''}")  # fmt: skip
    say(f"{'step':>5} {'t':>8} {'energy':>22} {'dissipation':>22}")
    energy, eps = diagnostics()
    say(f"{0:5d} {0.0:8.4f} {energy:22.15e} {eps:22.15e}")
    a = (1 / 6, 1 / 3, 1 / 3, 1 / 6)
    b = (0.5, 0.5, 1.0)
    stepping = 0.0
    spent = {"fft": 0.0, "transpose": 0.0}
    for step in range(1, args.steps + 1):
        comm.Barrier()
        before = f.split()
        t0 = time.perf_counter()
        u_hat1[...] = u_hat0[...] = u_hat
        for stage in range(4):
            right_hand_side(u_hat, rhs)
            if stage < 3:
                np.add(u_hat0, b[stage] * args.dt * rhs, out=u_hat)
            u_hat1 += a[stage] * args.dt * rhs
        u_hat[...] = u_hat1
        stepping += time.perf_counter() - t0
        after = f.split()
        for key in spent:
            spent[key] += after[key] - before[key]
        energy, eps = diagnostics()
        say(f"{step:5d} {step * args.dt:8.4f} {energy:22.15e} {eps:22.15e}")
    per_step = comm.allreduce(stepping, op=MPI.MAX) / args.steps
    fft_s = comm.allreduce(spent["fft"], op=MPI.MAX) / args.steps
    transpose_s = comm.allreduce(spent["transpose"], op=MPI.MAX) / args.steps
    rest = per_step - fft_s - transpose_s
    ms = [f"{x * 1e3:.2f}" for x in (per_step, fft_s, transpose_s, rest)]
    say(
        "# per step (ms, slowest rank): total {}, serial FFTs {}, transposes {}, rest {}".format(
            *ms
        )
    )
    f.destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
