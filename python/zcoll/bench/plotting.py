"""Plots of ``python -m zcoll.bench`` results (matplotlib, imported only when plotting).

:func:`plot_results` draws one benchmark's JSON document on a matplotlib Axes (for notebooks);
:func:`save_plot` writes it to a PNG file with the Agg canvas, touching no global pyplot state.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict

from .common import MEMCPY_METHOD, MPI_METHOD, PERSISTENT_SUFFIX

__all__ = ["load_results", "plot_results", "save_plot"]

_FIGSIZE = (9.0, 5.5)


def load_results(source) -> dict:
    """Return a bench JSON document: `source` itself if it is a dict, else the file it names."""
    if isinstance(source, dict):
        return source
    with open(os.fspath(source)) as f:
        return json.load(f)


def kind_of(document: dict) -> str:
    """``"collective"``, ``"copy"`` or ``"fft"``: which subcommand wrote `document`."""
    metadata = document.get("metadata", {})
    if metadata.get("benchmark") in ("copy", "fft"):
        return metadata["benchmark"]
    if "collective" in metadata:
        return "collective"
    raise ValueError("not a zcoll.bench JSON document (no metadata.collective or .benchmark)")


def _title(metadata: dict, what: str) -> str:
    date = str(metadata.get("date", ""))[:16].replace("T", " ")
    return f"{what}, P={metadata.get('P', '?')}, host {metadata.get('host', '?')}, {date}"


def _size_label(nbytes: float, _pos=None) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def _size_axis(axis) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator

    axis.set_major_locator(LogLocator(base=4))
    axis.set_major_formatter(FuncFormatter(_size_label))


def _plain_twin(method: str) -> str:
    """The plain method of a persistent one (``auto_init`` -> ``auto``, ``auto_init@heap`` ->
    ``auto@heap``); any other method itself."""
    name, at, kind = method.partition("@")
    return name.removesuffix(PERSISTENT_SUFFIX) + at + kind


def plot_collective(document: dict, ax) -> None:
    """Latency (µs) against block size per method on log-log axes; MPI dashed, memcpy dotted;
    a persistent method (``--persistent``: ``NAME_init``, ``MPI_init``) dash-dotted with
    crosses, in the colour of its plain twin."""
    by_method = defaultdict(list)
    for row in document["results"]:
        by_method[row["method"]].append((row["block_bytes"], row["latency_us"]))
    colors = {MPI_METHOD: "black", MEMCPY_METHOD: "grey"}
    for method in by_method:  # plain methods first: a plan takes its twin's colour
        if _plain_twin(method) == method:
            colors.setdefault(method, f"C{(len(colors) - 2) % 10}")
    for method, points in by_method.items():
        points.sort()
        twin = _plain_twin(method)
        persistent = twin != method
        style = "-." if persistent else {MPI_METHOD: "--", MEMCPY_METHOD: ":"}.get(method, "-")
        color = colors.get(twin)
        marker = "x" if persistent else "."
        ax.plot(*zip(*points), style, color=color, marker=marker, label=method)
    metadata = document["metadata"]
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    _size_axis(ax.xaxis)
    ax.set_xlabel("block size (bytes per pair of ranks)")
    ax.set_ylabel("latency per call (µs)")
    method = metadata.get("bench_method", "warm")
    ax.set_title(_title(metadata, f"{metadata['collective']} ({method})"))
    ax.legend(fontsize="small", ncol=2)
    ax.grid(True, which="major", alpha=0.3)


def plot_copy(document: dict, ax) -> None:
    """Bandwidth (GB/s per rank) against copy size per kernel: solid on rank 0 alone, dashed
    with all ranks copying at once."""
    metadata = document["metadata"]
    nranks = metadata.get("P", 1)
    series = defaultdict(list)
    for row in document["results"]:
        series[(row["method"], row["ranks"])].append((row["size_bytes"], row["gbps_per_rank"]))
    colors: dict[str, str] = {}
    for (method, ranks), points in series.items():
        points.sort()
        color = colors.setdefault(method, f"C{len(colors) % 10}")
        alone = ranks == 1
        label = method if alone else f"{method}, {ranks} ranks at once"
        ax.plot(*zip(*points), "-" if alone else "--", color=color, marker=".", label=label)
    ax.set_xscale("log", base=2)
    _size_axis(ax.xaxis)
    ax.set_xlabel("bytes per copy")
    ax.set_ylabel("GB/s per rank")
    ax.set_ylim(bottom=0)
    suffix = "" if nranks == 1 else f" (dashed: all {nranks} ranks at once)"
    ax.set_title(_title(metadata, "copy bandwidth" + suffix))
    ax.legend(fontsize="small", ncol=2)
    ax.grid(True, alpha=0.3)


def plot_fft(document: dict, ax) -> None:
    """Stacked bars per N: local FFT, transpose and other time (ms per forward+backward pair)
    for zcoll and mpi4py-fft side by side."""
    rows = document["results"]
    sizes = sorted({row["N"] for row in rows})
    methods = list(dict.fromkeys(row["method"] for row in rows))
    width = 0.8 / max(1, len(methods))
    parts = (("fft_ms", "local FFTs", "C0"), ("transpose_ms", "transposes", "C1"))
    for k, method in enumerate(methods):
        by_n = {row["N"]: row for row in rows if row["method"] == method}
        xs = [i + (k - (len(methods) - 1) / 2) * width for i, n in enumerate(sizes) if n in by_n]
        chosen = [by_n[n] for n in sizes if n in by_n]
        bottom = [0.0] * len(chosen)
        hatch = (None, "//", "..")[k % 3]
        for key, label, color in parts:
            heights = [row[key] or 0.0 for row in chosen]
            ax.bar(xs, heights, width, bottom=bottom, color=color, hatch=hatch,
                   label=f"{method}: {label}", edgecolor="white")  # fmt: skip
            bottom = [b + h for b, h in zip(bottom, heights)]
        other = [max(0.0, row["total_ms"] - b) for row, b in zip(chosen, bottom)]
        ax.bar(xs, other, width, bottom=bottom, color="C7", hatch=hatch,
               label=f"{method}: other", edgecolor="white")  # fmt: skip
    ax.set_xticks(range(len(sizes)), [f"N={n}" for n in sizes])
    ax.set_ylabel("ms per forward+backward pair")
    metadata = document["metadata"]
    hatched = f" (hatched: {', '.join(methods[1:])})" if len(methods) > 1 else ""
    ax.set_title(_title(metadata, f"fft {metadata.get('dtype', '')}{hatched}"))
    ax.legend(fontsize="small")
    ax.grid(True, axis="y", alpha=0.3)


_PLOTTERS = {"collective": plot_collective, "copy": plot_copy, "fft": plot_fft}


def plot_results(results, ax=None):
    """Draw a ``python -m zcoll.bench --json`` document.

    alltoall / allgather: latency against block size per method, log-log, MPI dashed (and the
    memcpy reference dotted); copy: bandwidth against copy size per kernel; fft: stacked bars of
    local-FFT / transpose / other time per N, zcoll beside mpi4py-fft.

    Parameters
    ----------
    results : dict or path-like
        The JSON document (``{"metadata": ..., "results": [...]}``) or the file holding it.
    ax : matplotlib.axes.Axes, optional
        Where to draw; a new figure (``matplotlib.pyplot.subplots``) if None.

    Returns
    -------
    matplotlib.axes.Axes
        The axes drawn on.
    """
    document = load_results(results)
    plotter = _PLOTTERS[kind_of(document)]
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=_FIGSIZE, layout="constrained")
    plotter(document, ax)
    return ax


def save_plot(results, path) -> None:
    """Draw `results` (see :func:`plot_results`) into the PNG file `path`, with the Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=_FIGSIZE, layout="constrained")
    FigureCanvasAgg(figure)
    plot_results(results, figure.add_subplot())
    figure.savefig(os.fspath(path), dpi=110)
