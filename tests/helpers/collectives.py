"""alltoall and allgather against mpi4py: seeded buffers, mpi4py's results on byte views,
bit-for-bit comparison."""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

import zcoll
from helpers import random_bytes


def seeded(comm: MPI.Comm, tag: int, nbytes: int) -> np.ndarray:
    return random_bytes(tag * 7919 + comm.rank * 104729 + nbytes, nbytes)


def make_buffer(comm, shape, dtype, arena: bool) -> np.ndarray:
    if arena:
        return zcoll.empty(comm, shape, dtype)
    return np.empty(shape, dtype)


def reference_alltoall(comm, send: np.ndarray) -> np.ndarray:
    out = np.empty_like(send)
    comm.Alltoall(
        [send.reshape(-1).view(np.uint8), MPI.BYTE], [out.reshape(-1).view(np.uint8), MPI.BYTE]
    )
    return out


def reference_allgather(comm, send: np.ndarray) -> np.ndarray:
    out = np.empty((comm.size, *send.shape), send.dtype)
    comm.Allgather(
        [send.reshape(-1).view(np.uint8), MPI.BYTE], [out.reshape(-1).view(np.uint8), MPI.BYTE]
    )
    return out


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def fill(a: np.ndarray, data: np.ndarray) -> None:
    a.reshape(-1).view(np.uint8)[:] = data
