"""zcoll.fft.pencil's tests (and DistArray's, on the same pencils): block shares, global
arrays, tilings and errors on every rank, written out independently of zcoll.fft."""

from __future__ import annotations

import numpy as np

import zcoll.fft.pencil as pencil_module
from helpers import all_ranks_agree


def block(n: int, p: int, r: int) -> tuple[int, int]:
    """(count, start) of rank r's block of n over p ranks: the first n % p hold one more."""
    q, rem = divmod(n, p)
    return q + (r < rem), r * q + min(r, rem)


def global_array(shape, dtype, seed: int) -> np.ndarray:
    """The same array on every rank."""
    g = np.random.default_rng(seed).standard_normal(shape) * 100
    if np.dtype(dtype).kind == "c":
        g = g + 1j * np.random.default_rng(seed + 1).standard_normal(shape)
    return g.astype(dtype)


def outcome(fn):
    try:
        return "ok", fn()
    except Exception as exc:  # noqa: BLE001 - the kind is what is compared
        return type(exc).__name__, exc


def expect_everywhere(comm, fn, exc_type: type, fragment: str = "") -> None:
    kind, result = outcome(fn)
    ok = kind == exc_type.__name__ and fragment in str(result)
    all_ranks_agree(comm, ok, f"expected {exc_type.__name__} ({fragment!r}), got {kind}: {result}")


def tiles(comm, shape, local_slice) -> bool:
    """The ranks' slices cover the global array exactly once."""
    count = np.zeros(shape, np.int64)
    for slices in comm.allgather(tuple((s.start, s.stop) for s in local_slice)):
        count[tuple(slice(a, b) for a, b in slices)] += 1
    return bool((count == 1).all())


def count_plan_runs(monkeypatch) -> list[int]:
    runs = [0]
    for cls in (pencil_module.TransferPlan, pencil_module._MultiNodeTransferPlan):
        if "run" not in vars(cls):  # inherited: counted through the class that defines it
            continue
        original = cls.run

        def counted(self, *args, _original=original, **kwargs):
            runs[0] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(cls, "run", counted)
    return runs
