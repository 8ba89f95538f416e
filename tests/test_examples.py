"""``examples/heat.py`` run in-process on every rank of the job, at small sizes.

The example is loaded as a module (examples/ is not a package) and its ``solve`` and ``main``
are called on every rank of ``MPI.COMM_WORLD`` (both are collective), so it runs under the
suite's own mpiexec job at every P, virtual nodes included. Its checks compare the field
with closed forms computed independently of the exchange (the exact solution of the scheme,
to rounding); here also zcoll's ghost exchange against mpi4py's ``Neighbor_alltoallv``, bit
for bit.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from helpers import all_ranks_agree

ROOT = Path(__file__).resolve().parent.parent
WORLD = MPI.COMM_WORLD
P = WORLD.size
#: Small grids that every P of the suite (1 to 8) can split; not square, so the faces (and
#: the counts of the neighbour exchange) differ between dimensions.
SIZES = {2: (12, 20), 3: (6, 8, 10)}
STEPS = 25


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(
        f"zcoll_example_{name}", ROOT / "examples" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


heat = load_example("heat")


def assert_checks_pass(result) -> None:
    # The errors are maxima over the ranks: the same verdict everywhere.
    details = {k: (result.errors[k], result.tolerances[k]) for k in result.errors}
    assert set(result.errors) == {"scheme", "heat equation", "residual"}
    assert result.failed == [], f"{result.library}: {details}"


@pytest.mark.parametrize("order", ["auto", "morton", "row"])
@pytest.mark.parametrize("dim", [2, 3])
def test_heat_zcoll_equals_mpi4py(dim, order):
    problem = heat.Problem(SIZES[dim], STEPS)
    mine = heat.solve(WORLD, problem, heat.ZCOLL, order=order, warmup=1)
    theirs = heat.solve(WORLD, problem, heat.MPI4PY, warmup=1)
    assert_checks_pass(mine)
    assert_checks_pass(theirs)
    same = mine.field.shape == theirs.field.shape and np.array_equal(mine.field, theirs.field)
    all_ranks_agree(WORLD, same, f"{dim}D field of zcoll (order {order}) != mpi4py's")
    # The residuals are sums in different orders (zcoll.allreduce, comm.Allreduce).
    assert mine.residual == pytest.approx(theirs.residual, rel=1e-12)


@pytest.mark.parametrize("persistent", [True, False])
@pytest.mark.parametrize("dim", [2, 3])
def test_heat_private_buffers(dim, persistent):
    """zcoll on plain NumPy exchange buffers (staged, or a plan's shadows), every few steps a
    residual; with a persistent plan and with a call per step."""
    problem = heat.Problem(SIZES[dim], STEPS)
    mine = heat.solve(
        WORLD, problem, heat.ZCOLL, arena=False, persistent=persistent, residual_every=4
    )
    theirs = heat.solve(WORLD, problem, heat.MPI4PY, residual_every=4)
    assert_checks_pass(mine)
    all_ranks_agree(WORLD, np.array_equal(mine.field, theirs.field), "private buffers")


@pytest.mark.parametrize("dim", [2, 3])
def test_heat_main_compare(dim, capsys):
    n = "x".join(map(str, SIZES[dim]))
    argv = ["--dim", str(dim), "--n", n, "--steps", str(STEPS), "--compare", "--log", "10"]
    status = heat.main(argv, WORLD)
    out = capsys.readouterr().out
    all_ranks_agree(WORLD, status == 0, f"heat.py {' '.join(argv)} returned {status}")
    if WORLD.rank == 0:
        assert "zcoll and mpi4py give the same field, bit for bit" in out
        assert "mpi4py / zcoll per step" in out and "all checks passed" in out
        assert out.count("zcoll.neighbor_alltoallv") >= 2  # in the title and the table


def test_heat_checks_catch_a_missing_ghost_exchange(monkeypatch, capsys):
    """Without unpacking, the ghosts stay 0 (as at the boundary): the check must fail."""
    if P == 1:
        pytest.skip("one rank has no neighbours: nothing to unpack")
    monkeypatch.setattr(heat.GhostExchange, "unpack", lambda self, u: None)
    argv = ["--n", "12x20", "--steps", "5", "--mpi"]
    status = heat.main(argv, WORLD)
    all_ranks_agree(WORLD, status == 1, f"broken exchange: heat.py returned {status}")
    if WORLD.rank == 0:
        assert "FAIL" in capsys.readouterr().out


def test_heat_usage_errors(capsys):
    assert heat.main(["--dim", "3", "--n", "4x4"], WORLD) == 2
    assert heat.main(["--n", "2x2", "--dims", f"{P + 1}x1"], WORLD) == 2
    if P > 1:  # more ranks along an axis than points
        assert heat.main(["--n", f"{P - 1}x4", "--dims", f"{P}x1", "--mpi"], WORLD) == 2
