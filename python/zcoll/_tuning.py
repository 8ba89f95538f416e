"""Tuning tables: what ``order="auto"``, ``copy="auto"`` and the reductions'
``algorithm="auto"`` follow -- the file format, its validation, loading, and sharing over a
communicator.

A tuning table is a versioned JSON file written by ``python -m zcoll.tune`` (see
:mod:`zcoll.tune`), keyed like MPICH's collective selection files: for each collective and
number of ranks per node, disjoint ranges of block sizes (bytes per block, both ends included)
with the order (or the eager path) and the copy mode that were fastest there on this machine.
Format version 2 adds ``reductions``: for each number of ranks per node and reduction
algorithm, the pieces of its cost model (HPDC'13 §3.4): calls of up to ``max_bytes`` bytes per
rank take ``a + b * bytes`` seconds. Version 3 adds ``internode``: for a multi-node alltoall or
allgather on a number of nodes and ranks per node, ranges of block sizes with how blocks cross
nodes (``method`` "round": in the call's round of messages, one per pair of nodes; "direct":
rank to rank; for an allgather also "concurrent" with a ``concurrency`` index:
:mod:`zcoll._internode`). The round carries the blocks up to the end of the first run of
"round" rules (the engine's crossing policy, ``cpp/zcoll/crossing_policy.hpp``).
Version 4 adds ``pulls``: for bcast, allreduce, reduce and reduce_scatter_block on a number of
ranks per node, the fewest bytes per rank (``min_bytes``) from which a call pulls buffers
outside shared memory by CMA rather than staging them (auto_policy.hpp's pull thresholds; a
forced ``ZCOLL_CMA_BYTES`` overrides them). Version 1-3 tables are still read.

Where: ``ZCOLL_TUNING_FILE`` if set, else ``tuning.json`` in the user's cache directory
(platformdirs). The mode (``ZCOLL_TUNING`` or :func:`zcoll.set_tuning`: ``table``, ``online``,
``off``) is a setting (:mod:`zcoll._settings`); online selection is the engine's (online_tuner.hpp).

The order must be the same on every rank, so ranks never read the file on their own: rank 0
of a communicator loads it when the communicator's zcoll context is created and broadcasts its
rules (:func:`shared_rules`). A table that cannot be read, is malformed, was written for another
format version or on another machine (CPU model or cache sizes differ) is ignored with a
``RuntimeWarning`` on that rank: the built-in rules apply, nothing fails.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, overload

from mpi4py import MPI

from . import _core, _settings
from ._registry import (
    ALLGATHER,
    ALLTOALL,
    COLLECTIVES,
    COPY_CODES,
    HYBRID,
    REDUCE_ALGORITHM_CODES,
    REDUCE_ALGORITHMS,
    RULE_COPIES,
    RULE_ORDER_CODES,
    RULE_ORDERS,
)

__all__ = [
    "FORMAT",
    "INTERNODE_METHOD_CODES",
    "VERSION",
    "InternodeRule",
    "PULLED_CALLS",
    "PullRule",
    "ReductionModel",
    "TuningError",
    "TuningRule",
    "TuningTable",
    "current_machine",
    "internode_rules_for",
    "load_tuning",
    "shared_rules",
    "shared_tuning",
    "tuning_path",
]

FORMAT = "zcoll-tuning"
VERSION = 4
#: Format versions this zcoll reads (1: no reduction models; 1, 2: no internode rules; 1-3: no
#: pull thresholds).
READABLE_VERSIONS = (1, 2, 3, 4)
#: What must match between the machine a table was made on and this one.
MACHINE_KEYS = ("cpu_model", "l2_bytes", "l3_bytes")
_MAX_BYTES = 2**63 - 1  # block sizes and thresholds travel to C++ as 64-bit sizes
_RULE_KEYS = {"collective", "ranks_per_node", "min_block", "max_block", "order", "copy"}


class TuningError(ValueError):
    """A tuning table is malformed, of another format version, or made on another machine."""


@functools.cache
def current_machine() -> dict:
    """What a tuning table records about the machine it was made on.

    Returns
    -------
    dict
        ``host``, ``cpu_model``, ``l2_bytes``, ``l3_bytes`` (hwloc) and ``cpus``. A table is
        used only where ``cpu_model``, ``l2_bytes`` and ``l3_bytes`` match.
    """
    facts = _settings.machine()
    return {
        "host": socket.gethostname(),
        "cpu_model": facts["cpu_model"].value,
        "l2_bytes": facts["l2_bytes"].value,
        "l3_bytes": facts["llc_bytes"].value,
        "cpus": facts["cpus"].value,
    }


@dataclass(frozen=True)
class TuningRule:
    """One row of a tuning table: calls of `collective` on a node of `ranks_per_node` ranks
    with blocks of `min_block` to `max_block` bytes (both included; ``None``: no upper bound)
    use `order` ("eager" for the eager path, where the call fits it) and `copy`; a hybrid copy
    with a `threshold` uses that T as is ("auto" in either field: the built-in rule)."""

    collective: str
    ranks_per_node: int
    min_block: int
    max_block: int | None
    order: str
    copy: str
    threshold: int | None = None

    def covers(self, block: int) -> bool:
        """Whether blocks of `block` bytes fall in this rule's range."""
        return self.min_block <= block and (self.max_block is None or block <= self.max_block)

    def engine_rule(self) -> tuple:
        """The rule as the C++ engine takes it (see ``NodeContext.set_tuning_rules``)."""
        order, copy = RULE_ORDER_CODES[self.order], COPY_CODES[self.copy]
        return (self.min_block, self.max_block, order, copy, self.threshold)

    def as_json(self) -> dict:
        """The rule as a JSON object."""
        return asdict(self)


@dataclass(frozen=True)
class ReductionModel:
    """One piece of a reduction algorithm's cost model: on a node of `ranks_per_node` ranks,
    `algorithm` takes ``a + b * bytes`` seconds for calls of up to `max_bytes` bytes per rank
    (``None``: no upper bound) and more than the previous piece's."""

    ranks_per_node: int
    algorithm: str
    max_bytes: int | None
    a: float
    b: float

    def engine_piece(self) -> tuple:
        """The piece as the C++ engine takes it (see ``NodeContext.set_reduction_model``)."""
        return (_MAX_BYTES if self.max_bytes is None else self.max_bytes, self.a, self.b)

    def as_json(self) -> dict:
        return asdict(self)


#: The ``method`` values of an internode rule (see :mod:`zcoll._internode`) and the engine's
#: codes of them (crossing_policy.hpp's crossing_method).
INTERNODE_METHOD_CODES: dict[str, int] = dict(_core.INTERNODE_METHOD_CODES)
INTERNODE_METHODS = tuple(INTERNODE_METHOD_CODES)  # "round", "direct", "concurrent"
#: The collectives an internode rule may name ("concurrent": allgather only).
INTERNODE_COLLECTIVES = (ALLTOALL, ALLGATHER)
_INTERNODE_KEYS = {
    "collective",
    "nodes",
    "ranks_per_node",
    "min_block",
    "max_block",
    "method",
    "concurrency",
}


@dataclass(frozen=True)
class InternodeRule:
    """How a multi-node `collective` on `nodes` nodes of `ranks_per_node` ranks (the largest
    node's) with blocks of `min_block` to `max_block` bytes (both included; ``None``: no upper
    bound) moves blocks between nodes: `method` "round" (in the call's round of messages),
    "direct" (rank to rank), or "concurrent" with the concurrency index `concurrency` (0
    otherwise)."""

    collective: str
    nodes: int
    ranks_per_node: int
    min_block: int
    max_block: int | None
    method: str
    concurrency: int = 0

    def covers(self, block: int) -> bool:
        """Whether blocks of `block` bytes fall in this rule's range."""
        return self.min_block <= block and (self.max_block is None or block <= self.max_block)

    def as_json(self) -> dict:
        return asdict(self)


#: The calls with a pull threshold of their own, by the name a table gives them, and the
#: engine's name of each.
PULLED_CALLS: dict[str, str] = {
    "bcast": "bcast",
    "allreduce": "allreduce",
    "reduce": "reduce",
    "reduce_scatter_block": "reduce_scatter",
}
_PULL_KEYS = {"call", "ranks_per_node", "min_bytes"}


@dataclass(frozen=True)
class PullRule:
    """On a node of `ranks_per_node` ranks, a `call` (a key of :data:`PULLED_CALLS`) of at
    least `min_bytes` bytes per rank pulls buffers outside shared memory by CMA; smaller ones
    stage them."""

    call: str
    ranks_per_node: int
    min_bytes: int

    def as_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TuningTable:
    """A validated tuning table (see :func:`load_tuning`)."""

    rules: tuple[TuningRule, ...]
    machine: dict
    created: str = ""
    zcoll_version: str = ""
    reductions: tuple[ReductionModel, ...] = ()
    internode: tuple[InternodeRule, ...] = ()
    pulls: tuple[PullRule, ...] = ()

    def models_for(self, ranks_per_node: int) -> dict[str, tuple[ReductionModel, ...]]:
        """The reduction cost models for one node size, by algorithm (pieces by size)."""
        out: dict[str, list[ReductionModel]] = {}
        for m in self.reductions:
            if m.ranks_per_node == ranks_per_node:
                out.setdefault(m.algorithm, []).append(m)
        return {k: tuple(sorted(v, key=_piece_key)) for k, v in out.items()}

    def rules_for(self, collective: str, ranks_per_node: int) -> tuple[TuningRule, ...]:
        """The rules of one collective and node size, by block range."""
        mine = [
            r
            for r in self.rules
            if r.collective == collective and r.ranks_per_node == ranks_per_node
        ]
        return tuple(sorted(mine, key=lambda r: r.min_block))

    def stale_reason(self, machine: dict | None = None) -> str | None:
        """Why this table does not describe `machine` (this one by default), or None."""
        machine = current_machine() if machine is None else machine
        for key in MACHINE_KEYS:
            if self.machine.get(key) != machine.get(key):
                return (
                    f"it was made on another machine ({key} {self.machine.get(key)!r}, "
                    f"this machine has {machine.get(key)!r}); rerun python -m zcoll.tune"
                )
        return None

    def as_json(self) -> dict:
        """The table as a JSON document (what :func:`TuningTable.from_json` reads)."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "created": self.created,
            "zcoll_version": self.zcoll_version,
            "machine": dict(self.machine),
            "rules": [r.as_json() for r in self.rules],
            "reductions": [m.as_json() for m in self.reductions],
            "internode": [r.as_json() for r in self.internode],
            "pulls": [r.as_json() for r in self.pulls],
        }

    @classmethod
    def from_json(cls, doc) -> TuningTable:
        """Validate a parsed JSON document; raises :class:`TuningError` saying what is wrong."""
        if not isinstance(doc, dict):
            raise TuningError("the document is not a JSON object")
        if doc.get("format") != FORMAT:
            raise TuningError(f"'format' is {doc.get('format')!r}, expected {FORMAT!r}")
        version = doc.get("version")
        if type(version) is not int:
            raise TuningError(f"'version' must be an integer, got {version!r}")
        if version not in READABLE_VERSIONS:
            raise TuningError(
                f"format version {version}; this zcoll reads versions {READABLE_VERSIONS}"
            )
        machine = doc.get("machine")
        if not isinstance(machine, dict):
            raise TuningError("'machine' must be an object")
        for key in MACHINE_KEYS:
            if key not in machine:
                raise TuningError(f"'machine' has no {key!r}")
        rules = doc.get("rules")
        if not isinstance(rules, list):
            raise TuningError("'rules' must be a list")
        parsed = tuple(_parse_rule(i, r) for i, r in enumerate(rules))
        _check_disjoint(parsed)
        models = doc.get("reductions", []) if version >= 2 else []
        if not isinstance(models, list):
            raise TuningError("'reductions' must be a list")
        reductions = tuple(_parse_model(i, m) for i, m in enumerate(models))
        crossing = doc.get("internode", []) if version >= 3 else []
        if not isinstance(crossing, list):
            raise TuningError("'internode' must be a list")
        internode = tuple(parse_internode_rule(i, r) for i, r in enumerate(crossing))
        _check_internode_disjoint(internode)
        thresholds = doc.get("pulls", []) if version >= 4 else []
        if not isinstance(thresholds, list):
            raise TuningError("'pulls' must be a list")
        pulls = tuple(_parse_pull(i, r) for i, r in enumerate(thresholds))
        _check_one_pull_each(pulls)
        return cls(
            parsed,
            dict(machine),
            str(doc.get("created", "")),
            str(doc.get("zcoll_version", "")),
            reductions,
            internode,
            pulls,
        )


def _piece_key(m: ReductionModel) -> int:
    return _MAX_BYTES if m.max_bytes is None else m.max_bytes


def _check_count(where: str, key: str, value) -> None:
    if type(value) is not int or not 1 <= value <= 1 << 20:
        raise TuningError(f"{where}: {key} must be a positive integer, got {value!r}")


def _check_one_of(where: str, key: str, value, choices) -> None:
    if value not in choices:
        raise TuningError(f"{where}: {key} must be one of {choices}, got {value!r}")


_MODEL_KEYS = {"ranks_per_node", "algorithm", "max_bytes", "a", "b"}


def _parse_model(index: int, model) -> ReductionModel:
    where = f"reduction model {index}"
    if not isinstance(model, dict) or model.keys() != _MODEL_KEYS:
        raise TuningError(f"{where} must be an object with keys {sorted(_MODEL_KEYS)}")
    _check_one_of(where, "algorithm", model["algorithm"], REDUCE_ALGORITHMS)
    ranks = model["ranks_per_node"]
    _check_count(where, "ranks_per_node", ranks)
    high = _size(model["max_bytes"], f"{where}: max_bytes", optional=True)
    costs = []
    for key in ("a", "b"):
        value = model[key]
        if type(value) not in (int, float) or not 0 <= value < float("inf"):
            raise TuningError(f"{where}: {key} must be a finite number >= 0, got {value!r}")
        costs.append(float(value))
    return ReductionModel(ranks, model["algorithm"], high, costs[0], costs[1])


@overload
def _size(value, what: str, *, minimum: int = 0, optional: Literal[False] = False) -> int: ...
@overload
def _size(value, what: str, *, minimum: int = 0, optional: bool) -> int | None: ...
def _size(value, what: str, *, minimum: int = 0, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if type(value) is not int or not minimum <= value <= _MAX_BYTES:
        raise TuningError(f"{what} must be an integer in [{minimum}, 2**63), got {value!r}")
    return value


def _parse_rule(index: int, rule) -> TuningRule:
    where = f"rule {index}"
    if not isinstance(rule, dict):
        raise TuningError(f"{where} is not an object")
    missing = _RULE_KEYS - rule.keys()
    unknown = rule.keys() - _RULE_KEYS - {"threshold"}
    if missing or unknown:
        raise TuningError(
            f"{where}: missing keys {sorted(missing)}, unknown keys {sorted(unknown)}"
        )
    _check_one_of(where, "collective", rule["collective"], COLLECTIVES)
    _check_one_of(where, "order", rule["order"], RULE_ORDERS)
    _check_one_of(where, "copy", rule["copy"], RULE_COPIES)
    low = _size(rule["min_block"], f"{where}: min_block")
    high = _size(rule["max_block"], f"{where}: max_block", minimum=low, optional=True)
    threshold = _size(rule.get("threshold"), f"{where}: threshold", optional=True)
    if threshold is not None and rule["copy"] != HYBRID:
        raise TuningError(f"{where}: a threshold needs copy 'hybrid', got {rule['copy']!r}")
    ranks = rule["ranks_per_node"]
    _check_count(where, "ranks_per_node", ranks)
    return TuningRule(rule["collective"], ranks, low, high, rule["order"], rule["copy"], threshold)


def _parse_pull(index: int, rule) -> PullRule:
    where = f"pull threshold {index}"
    if not isinstance(rule, dict) or rule.keys() != _PULL_KEYS:
        raise TuningError(f"{where} must be an object with keys {sorted(_PULL_KEYS)}")
    _check_one_of(where, "call", rule["call"], tuple(PULLED_CALLS))
    _check_count(where, "ranks_per_node", rule["ranks_per_node"])
    low = _size(rule["min_bytes"], f"{where}: min_bytes")
    return PullRule(rule["call"], rule["ranks_per_node"], low)


def _check_one_pull_each(pulls: tuple[PullRule, ...]) -> None:
    seen: set[tuple[str, int]] = set()
    for r in pulls:
        key = (r.call, r.ranks_per_node)
        if key in seen:
            raise TuningError(
                f"two pull thresholds for {r.call} with {r.ranks_per_node} ranks per node"
            )
        seen.add(key)


def parse_internode_rule(index: int, rule) -> InternodeRule:
    """Validate one internode rule (a JSON object); raises :class:`TuningError`."""
    where = f"internode rule {index}"
    if not isinstance(rule, dict) or rule.keys() != _INTERNODE_KEYS:
        raise TuningError(f"{where} must be an object with keys {sorted(_INTERNODE_KEYS)}")
    _check_one_of(where, "collective", rule["collective"], INTERNODE_COLLECTIVES)
    _check_one_of(where, "method", rule["method"], INTERNODE_METHODS)
    if rule["method"] == "concurrent" and rule["collective"] != ALLGATHER:
        raise TuningError(f"{where}: method 'concurrent' is an allgather's")
    for key in ("nodes", "ranks_per_node"):
        _check_count(where, key, rule[key])
    concurrency = rule["concurrency"]
    low = 1 if rule["method"] == "concurrent" else 0
    if type(concurrency) is not int or not low <= concurrency <= 1 << 20:
        raise TuningError(
            f"{where}: concurrency must be an integer >= {low} for {rule['method']!r}, "
            f"got {concurrency!r}"
        )
    low_block = _size(rule["min_block"], f"{where}: min_block")
    high = _size(rule["max_block"], f"{where}: max_block", minimum=low_block, optional=True)
    return InternodeRule(
        rule["collective"],
        rule["nodes"],
        rule["ranks_per_node"],
        low_block,
        high,
        rule["method"],
        concurrency,
    )


def _check_internode_disjoint(rules: tuple[InternodeRule, ...]) -> None:
    groups: dict[tuple[str, int, int], list[InternodeRule]] = {}
    for r in rules:
        groups.setdefault((r.collective, r.nodes, r.ranks_per_node), []).append(r)
    for (collective, nodes, ranks), group in groups.items():
        group.sort(key=lambda r: r.min_block)
        for a, b in zip(group, group[1:]):
            if a.max_block is None or b.min_block <= a.max_block:
                raise TuningError(
                    f"internode rules for {collective} on {nodes} nodes of {ranks} ranks "
                    f"overlap: blocks [{a.min_block}, {a.max_block}] and "
                    f"[{b.min_block}, {b.max_block}]"
                )


def _check_disjoint(rules: tuple[TuningRule, ...]) -> None:
    groups: dict[tuple[str, int], list[TuningRule]] = {}
    for r in rules:
        groups.setdefault((r.collective, r.ranks_per_node), []).append(r)
    for (collective, ranks), group in groups.items():
        group.sort(key=lambda r: r.min_block)
        for a, b in zip(group, group[1:]):
            if a.max_block is None or b.min_block <= a.max_block:
                raise TuningError(
                    f"rules for {collective} with {ranks} ranks per node overlap: blocks "
                    f"[{a.min_block}, {a.max_block}] and [{b.min_block}, {b.max_block}]"
                )


def tuning_path() -> Path:
    """Where zcoll looks for its tuning table.

    Returns
    -------
    pathlib.Path
        ``ZCOLL_TUNING_FILE`` if set, else ``tuning.json`` in the user's cache directory
        (``platformdirs.user_cache_dir("zcoll")``, e.g. ``~/.cache/zcoll/tuning.json``).
    """
    return _settings.read("tuning_file").value


def load_tuning(
    path: str | os.PathLike | None = None, *, check_machine: bool = True
) -> TuningTable:
    """Read and validate a tuning table.

    Local (no MPI). Collectives do not need it: they load the table themselves.

    Parameters
    ----------
    path : str or path-like, optional
        The file; :func:`tuning_path` by default.
    check_machine : bool, optional
        Reject a table made on another machine (CPU model or cache sizes differ).

    Returns
    -------
    TuningTable
        Its rules (``rules_for(collective, ranks_per_node)``), machine and creation data.

    Raises
    ------
    OSError
        If the file cannot be read.
    ValueError
        (:class:`TuningError`) if it is not valid JSON, not a zcoll tuning table of this format
        version, has malformed or overlapping rules, or (`check_machine`) was made elsewhere.
    """
    path = tuning_path() if path is None else Path(path)
    stat = path.stat()
    table = _load_cached(str(path), stat.st_mtime_ns, stat.st_size, stat.st_ino)
    if check_machine and (reason := table.stale_reason()):
        raise TuningError(reason)
    return table


@functools.lru_cache(maxsize=8)
def _load_cached(path: str, mtime_ns: int, size: int, inode: int) -> TuningTable:  # noqa: ARG001
    with open(path, "rb") as f:
        data = f.read()
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError too
        raise TuningError(f"not valid JSON ({exc})") from None
    return TuningTable.from_json(doc)


# --- sharing a table over a communicator -------------------------------------------------------


def _rules_or_warn(mode: str) -> tuple[TuningRule, ...]:
    """This process's table rules, or () with a RuntimeWarning when it cannot be used."""
    return _table_or_warn(mode).rules


@dataclass(frozen=True)
class SharedTuning:
    """A table's parts a context follows (all node sizes and layouts; empty: built-in)."""

    rules: tuple[TuningRule, ...] = ()
    reductions: tuple[ReductionModel, ...] = ()
    internode: tuple[InternodeRule, ...] = ()
    pulls: tuple[PullRule, ...] = ()


def _table_or_warn(mode: str) -> SharedTuning:
    """This process's table rules, reduction models, internode rules and pull thresholds,
    or none of them with a RuntimeWarning when it cannot be used."""
    if mode == "off":
        return SharedTuning()
    path: str | Path = _settings.VARIABLES["tuning_file"].env
    try:
        path = tuning_path()
        named = _settings.read("tuning_file").text
        if not named and not path.exists():
            return SharedTuning()  # no table made yet: the ordinary case, nothing to say
        table = load_tuning(path)
        return SharedTuning(table.rules, table.reductions, table.internode, table.pulls)
    except Exception as exc:  # noqa: BLE001 - a tuning table must never stop a program
        warnings.warn(
            f"zcoll: ignoring the tuning table {path}: {exc}; using the built-in rules",
            RuntimeWarning,
            stacklevel=3,
        )
        return SharedTuning()


def internode_rules_for(
    rules: tuple[InternodeRule, ...], collective: str, nodes: int, ranks_per_node: int
) -> list[InternodeRule]:
    """The rules of `collective` on `nodes` nodes of (at most) `ranks_per_node` ranks, by
    block size."""
    mine = [
        r
        for r in rules
        if (r.collective, r.nodes, r.ranks_per_node) == (collective, nodes, ranks_per_node)
    ]
    return sorted(mine, key=lambda r: r.min_block)


def shared_rules(comm: MPI.Comm, mode: str) -> tuple[TuningRule, ...]:
    """Collective: rank 0's table rules (all node sizes) under `mode`, the same on every rank
    of `comm` (rank 0 reads the file; a table it cannot use gives () and a warning there)."""
    return shared_tuning(comm, mode).rules


def shared_tuning(comm: MPI.Comm, mode: str) -> SharedTuning:
    """Collective: rank 0's table rules, reduction models, internode rules and pull thresholds
    (all node sizes and layouts) under `mode`, the same on every rank of `comm`, in one
    broadcast."""
    return comm.bcast(_table_or_warn(mode) if comm.rank == 0 else None, root=0)


def reduction_pieces(
    models: tuple[ReductionModel, ...], ranks_per_node: int
) -> dict[int, list[tuple]]:
    """The engine's cost-model pieces for one node size: algorithm code -> pieces (every
    algorithm present; an empty list restores the built-in estimate)."""
    out: dict[int, list[tuple]] = {REDUCE_ALGORITHM_CODES[a]: [] for a in REDUCE_ALGORITHMS}
    for m in models:
        if m.ranks_per_node == ranks_per_node:
            out[REDUCE_ALGORITHM_CODES[m.algorithm]].append(m.engine_piece())
    return out


def pull_thresholds(pulls: tuple[PullRule, ...], ranks_per_node: int) -> dict[str, int | None]:
    """The engine's pull thresholds for one node size: engine call name -> fewest bytes per
    rank that pull (every pulled call present; None restores the built-in rule)."""
    out: dict[str, int | None] = dict.fromkeys(PULLED_CALLS.values())
    for r in pulls:
        if r.ranks_per_node == ranks_per_node:
            out[PULLED_CALLS[r.call]] = r.min_bytes
    return out
