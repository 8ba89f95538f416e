"""The files of ``python -m zcoll.bench``: ``--json``, ``--csv`` and ``--plot``."""

from __future__ import annotations

import csv
import json

from .plotting import save_plot

__all__ = ["write_outputs"]


def write_outputs(
    args, rows: list[dict], metadata: dict, fields=None, extra: dict | None = None
) -> None:
    """Write the raw rows (and metadata, for JSON) to ``--json`` / ``--csv``, and draw them
    into ``--plot`` (see :func:`.plotting.save_plot`), where requested.

    `fields` are the CSV columns (default: the keys of the first row); `extra` adds top-level
    keys to the JSON document besides ``metadata`` and ``results``. Call it on one rank only.
    """
    if fields is None:
        fields = list(rows[0]) if rows else []
    document = {"metadata": metadata, "results": rows, **(extra or {})}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(document, f, indent=2)
            f.write("\n")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
    if getattr(args, "plot", None):
        save_plot(document, args.plot)
