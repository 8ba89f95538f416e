"""Execute the notebooks in notebooks/ in small mode (``ZCOLL_NOTEBOOK_SMALL=1``) with nbclient.

Each notebook runs in a fresh Jupyter kernel on this Python (``sys.executable``), in a copy of
notebooks/ (and examples/, which fft.ipynb runs) in a temporary directory, so nothing is
written into the repository. The kernel gets the environment without the variables of the MPI
job this test may itself run in (under ``mpiexec -n 1``): the notebooks start their own mpiexec
jobs, and Open MPI refuses nested launches. The tests run only when ``COMM_WORLD`` has a single
rank: a notebook is not collective, and it starts its own MPI jobs.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
from mpi4py import MPI

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")
from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402  (after the skips)
from jupyter_client.manager import AsyncKernelManager  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
CELL_TIMEOUT = 240  # seconds; a small-mode notebook takes a few seconds per cell
INLINE_BACKEND = "module://matplotlib_inline.backend_inline"  # figures as PNG outputs

pytestmark = pytest.mark.skipif(
    MPI.COMM_WORLD.size != 1,
    reason="notebooks run once, in the P=1 run: each starts its own mpiexec jobs",
)


def _load_mpirun():
    """notebooks/mpirun.py, the notebooks' helper (not on sys.path)."""
    spec = importlib.util.spec_from_file_location("zcoll_notebooks_mpirun", NOTEBOOKS / "mpirun.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A scratch copy of notebooks/ (with data/) next to a copy of examples/."""
    root = tmp_path_factory.mktemp("zcoll-notebooks")
    ignore = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints")
    shutil.copytree(NOTEBOOKS, root / "notebooks", ignore=ignore)
    shutil.copytree(ROOT / "examples", root / "examples", ignore=ignore)
    return root / "notebooks"


def execute(workdir: Path, name: str):
    """Run notebook `name` in `workdir` in small mode; return it with its outputs.

    Raises nbclient's CellExecutionError (naming the cell) if a cell raises.
    """
    notebook = nbformat.read(workdir / name, as_version=4)
    env = _load_mpirun().mpi_free_environ()
    env.update(ZCOLL_NOTEBOOK_SMALL="1", MPLBACKEND=INLINE_BACKEND)
    # No kernel directories: "python3" is then ipykernel's own spec, which runs sys.executable.
    kernel = AsyncKernelManager(
        kernel_name="python3", kernel_spec_manager=KernelSpecManager(kernel_dirs=[])
    )
    client = nbclient.NotebookClient(
        notebook,
        km=kernel,
        timeout=CELL_TIMEOUT,
        resources={"metadata": {"path": str(workdir)}},
    )
    client.execute(env=env)
    return notebook


def tagged(notebook, tag: str) -> list:
    cells = [c for c in notebook.cells if tag in c.get("metadata", {}).get("tags", [])]
    assert cells, f"no cell tagged {tag!r}"
    return cells


def text_of(cell) -> str:
    """Everything a code cell printed or displayed as text."""
    parts = []
    for output in cell.get("outputs", []):
        parts.append(output.get("text", ""))
        parts.append(output.get("data", {}).get("text/plain", ""))
    return "".join(parts)


def assert_figures(notebook, name: str) -> None:
    """Every cell tagged "figure" displayed at least one PNG figure."""
    for cell in tagged(notebook, "figure"):
        pngs = [o for o in cell.outputs if "image/png" in o.get("data", {})]
        assert pngs, f"{name}: no figure from cell\n{cell.source[:300]}\noutput: {text_of(cell)}"


def test_orders(workdir):
    notebook = execute(workdir, "orders.ipynb")
    assert_figures(notebook, "orders.ipynb")


def test_performance(workdir):
    notebook = execute(workdir, "performance.ipynb")
    assert_figures(notebook, "performance.ipynb")
    printed = "".join(text_of(c) for c in notebook.cells if c.cell_type == "code")
    assert "alltoall, P=2" in printed and "allgather, P=2" in printed  # freshly measured runs
    assert "data/" not in printed  # small mode plots its own runs, not the shipped files


def test_fft(workdir):
    notebook = execute(workdir, "fft.ipynb")
    assert_figures(notebook, "fft.ipynb")
    (example,) = tagged(notebook, "example")
    assert "all checks passed" in text_of(example)
    (check,) = tagged(notebook, "check")
    assert "check passed" in text_of(check)
