"""Run MPI programs from a notebook: mpiexec with the right flags, a clean environment, a timeout.

The notebooks in this folder run zcoll's benchmarks as separate MPI jobs (a Jupyter kernel is
not an MPI job of several ranks). A kernel started from inside an MPI job -- as the test suite
does, under ``mpiexec -n 1`` -- inherits that job's environment (Open MPI's ``OMPI_*``, PMIx's
``PMIX_*``, ...), and a nested mpiexec refuses to start ("mpiexec does not support recursive
calls") or its ranks fail in MPI_Init; :func:`mpi_free_environ` drops those variables.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys

__all__ = ["MPI_ENV_PREFIXES", "mpi_free_environ", "mpiexec_command", "run_mpi", "small_mode"]

#: Environment variables an MPI launcher sets for its ranks (Open MPI, PMIx, PRRTE, MPICH/Hydra).
#: User-set ``OMPI_MCA_*`` options are dropped with them.
MPI_ENV_PREFIXES = (
    "OMPI_", "PMIX_", "PRTE_", "PRRTE_", "OPAL_", "ORTE_",  # Open MPI, PMIx, PRRTE
    "PMI_", "HYDRA_", "HYDI_",  # MPICH's Hydra
)  # fmt: skip

#: Seconds mpiexec gets to exit after SIGTERM before it is killed.
_GRACE_SECONDS = 5


def small_mode() -> bool:
    """Whether ``ZCOLL_NOTEBOOK_SMALL`` asks for tiny problem sizes (CI): set and not ``0``."""
    return os.environ.get("ZCOLL_NOTEBOOK_SMALL", "0") not in ("", "0")


def mpi_free_environ() -> dict[str, str]:
    """Return a copy of ``os.environ`` without the variables of an enclosing MPI job."""
    return {k: v for k, v in os.environ.items() if not k.startswith(MPI_ENV_PREFIXES)}


def mpiexec_command(ranks: int) -> list[str]:
    """Return the command line prefix that starts `ranks` ranks.

    With Open MPI it adds ``--oversubscribe`` (more ranks than cores) and, as root,
    ``--allow-run-as-root``; other launchers (MPICH) get only ``-n``.

    Raises
    ------
    FileNotFoundError
        If there is no ``mpiexec`` or ``mpirun`` on ``PATH``.
    """
    exe = shutil.which("mpiexec") or shutil.which("mpirun")
    if exe is None:
        raise FileNotFoundError("no mpiexec on PATH (install openmpi-bin or mpich)")
    version = subprocess.run(
        [exe, "--version"], capture_output=True, text=True, env=mpi_free_environ(), timeout=30
    ).stdout
    cmd = [exe]
    if "Open MPI" in version or "OpenRTE" in version:
        cmd.append("--oversubscribe")
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
    return [*cmd, "-n", str(ranks)]


def run_mpi(ranks: int, args: list[str], *, timeout: float = 300) -> str:
    """Run ``python ARGS`` on `ranks` ranks and return its output (stdout, then stderr).

    The job runs with this kernel's Python (``sys.executable``), in the current directory,
    without the variables of an enclosing MPI job, in its own process group: if it outlives
    `timeout` the whole group is terminated, so no rank is left behind.

    Parameters
    ----------
    ranks : int
        Number of MPI ranks.
    args : list of str
        Arguments of ``python``, e.g. ``["-m", "zcoll.bench", "fft", "--sizes", "32"]``.
    timeout : float, optional
        Seconds before the job is killed (default 300).

    Raises
    ------
    RuntimeError
        If the job exits with a non-zero status or runs out of time; the message holds the
        command and the end of its output.
    """
    cmd = [*mpiexec_command(ranks), sys.executable, *args]
    job = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=mpi_free_environ(),
        start_new_session=True,
    )
    try:
        out, err = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = _stop(job)
        raise RuntimeError(
            f"{shlex.join(cmd)} did not finish in {timeout:g} s:\n{_tail(out, err)}"
        ) from None
    if job.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} exited with {job.returncode}:\n{_tail(out, err)}")
    return out + err


def _stop(job: subprocess.Popen) -> tuple[str, str]:
    """Terminate `job`'s process group (SIGTERM, then SIGKILL) and collect what it wrote."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(job.pid, sig)
        except ProcessLookupError:
            break
        try:
            return job.communicate(timeout=_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            continue
    return "", "(no output: the job could not be stopped)"


def _tail(out: str, err: str, chars: int = 3000) -> str:
    return (out[-chars:] + "\n" + err[-chars:]).strip()
