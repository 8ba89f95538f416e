"""Everything zcoll reads from the environment or the machine, parsed in one place.

Each ``ZCOLL_*`` variable is described once, in :data:`VARIABLES` (its name, parser, default and
when it is read), and read only by :func:`read`. :func:`settings` gathers them, with the machine
facts (cache sizes from hwloc, CPU model and count, read once) and the choices made through
:func:`zcoll.set_timeout` and :func:`zcoll.set_tuning`, into one frozen :class:`Settings`.

When each variable is read:

* at import: ``ZCOLL_TIMEOUT`` (the default peer-wait bound) and ``ZCOLL_COPY_ISA`` (the copy
  kernel, selected by :mod:`zcoll._copy` when zcoll is imported);
* on first use: ``ZCOLL_TUNING`` (the tuning mode of the whole process);
* when a communicator's context is created (the others): each context keeps the
  :class:`Settings` it was made with, so changing the environment later affects only contexts
  made later.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import platform
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, NamedTuple

from . import _core, _mpi_library
from ._registry import AUTO, BARRIERS, FLAT

__all__ = [
    "SLEEP_SLICE",
    "TUNING_MODES",
    "VARIABLES",
    "Reading",
    "Settings",
    "current",
    "get_timeout",
    "get_tuning",
    "machine",
    "override",
    "read",
    "settings",
    "zcoll_environment",
]

#: Values of ``ZCOLL_TUNING`` and :func:`zcoll.set_tuning`.
TUNING_MODES = ("table", "online", "off")

# order="auto" moves calls of at most this many bytes per rank through the one-barrier eager
# path (two copies, one barrier) rather than the ordered one-copy schedule (two barriers).
# Measured crossover on a 2-core EPYC VM: ~4-8 KiB per rank at P=2; at P=4 on 2 cores (every
# barrier costs context switches) eager and ordered tie at 16 KiB per rank (alltoall 6.6 vs
# 6.9 us, neighbor_alltoall 9.2 vs 10.2 us) and eager loses above (32 KiB: 9.6 vs 7.4 us;
# 64 KiB: 15.7 vs 8.6 us), so 16 KiB (64 KiB before 2026-11, when the ordered path cost more).
DEFAULT_EAGER_BYTES = 4096
OVERSUBSCRIBED_EAGER_BYTES = 16384
# Busy-poll iterations of a node wait before it starts yielding. Oversubscribed ranks must hand
# their core to the rank they wait for: no spinning at all.
DEFAULT_SPIN = 4096
OVERSUBSCRIBED_SPIN = 0
# sched_yield polls before sleeping on the futex. Oversubscribed ranks yield for long (as Open
# MPI's shared-memory transport does) before sleeping.
DEFAULT_YIELDS = 64
OVERSUBSCRIBED_YIELDS = 20000
#: Seconds of one futex sleep of a node wait, between checks of the timeout and of dead peers.
SLEEP_SLICE = 0.02
DEFAULT_TIMEOUT = 60.0
# Cache sizes when hwloc cannot tell: (L2 of a core, last-level cache).
CACHE_FALLBACK = (512 * 1024, 8 * 1024 * 1024)

DEFAULT = "default"
ENVIRONMENT = "environment"


# --- parsers: (variable name, its text) -> value, ValueError with the message users see ------


@dataclasses.dataclass(frozen=True)
class _Number:
    """The one number parser: `kind` (int or float), at least 0 (or > 0 when `positive`).

    `invalid` and `negative` are the messages' tails (after ``zcoll: NAME``); ``{text}`` is the
    variable's text, ``{kind}`` the kind's name, ``{bound}`` ">= 0" or "positive"."""

    kind: type = int
    positive: bool = False
    invalid: str = "={text!r} is not a valid {kind}"
    negative: str = " must be {bound}, got {text!r}"

    def __call__(self, name: str, text: str):
        fill = {"kind": self.kind.__name__, "bound": "positive" if self.positive else ">= 0"}
        try:
            value = self.kind(text)
        except ValueError:
            raise ValueError(f"zcoll: {name}" + self.invalid.format(text=text, **fill)) from None
        if value < 0 or (self.positive and not value > 0):
            raise ValueError(f"zcoll: {name}" + self.negative.format(text=text, **fill))
        return value


def _barrier(name: str, text: str) -> str:
    if text not in BARRIERS:
        raise ValueError(f"zcoll: {name} must be one of {sorted(BARRIERS)}, got {text!r}")
    return text


def _one_of(values: tuple[str, ...]) -> Callable[[str, str], str]:
    """A parser of a case-insensitive choice among `values` (empty text: the first)."""

    def parse(name: str, text: str) -> str:
        value = text.strip().lower() or values[0]
        if value not in values:
            raise ValueError(f"zcoll: {name} must be one of {values}, got {value!r}")
        return value

    return parse


def _copy_isa(name: str, text: str) -> str:  # noqa: ARG001 - the kernel is checked when selected
    return text.strip().lower() or AUTO


def _path_or_default(default: Callable[[], Path | None]):
    def parse(name: str, text: str) -> Path | None:  # noqa: ARG001
        return Path(text).expanduser() if text else default()

    return parse


#: What platformdirs reads from the environment to find the user's cache directory (on Linux and
#: macOS; the rest comes from the user id and the platform, fixed for the process).
_CACHE_DIR_ENV = ("XDG_CACHE_HOME", "HOME")


def _default_tuning_file() -> Path:
    return _tuning_file_in(*map(os.environ.get, _CACHE_DIR_ENV))


@functools.cache
def _tuning_file_in(xdg_cache_home: str | None, home: str | None) -> Path:  # noqa: ARG001
    # Keyed on the variables platformdirs reads (~30 us a call, once per context otherwise).
    import platformdirs  # only when the default is needed

    return Path(platformdirs.user_cache_dir("zcoll")) / "tuning.json"


def _no_replay() -> None:
    return None


def _topology(name: str, text: str) -> str | None:
    """An hwloc synthetic description or XML file path, checked by loading it with hwloc."""
    text = text.strip()
    if not text:
        return None
    try:
        _core.described_topology(text)
    except ValueError as e:
        raise ValueError(f"zcoll: {name}: {str(e).removeprefix('zcoll: ')}") from None
    return text


class _Variable(NamedTuple):
    env: str  # the environment variable
    parse: Callable[[str, str], Any]
    default: Any  # the value when unset (a callable: called then)
    when: str  # "import", "first use" or "context"
    doc: str


#: Field of :class:`Settings` -> its environment variable, parser, default and when it is read.
VARIABLES: Mapping[str, _Variable] = MappingProxyType(
    {
        "timeout": _Variable(
            "ZCOLL_TIMEOUT",
            _Number(float, positive=True),
            DEFAULT_TIMEOUT,
            "import",
            "seconds a rank waits for a peer before PeerError",
        ),
        "barrier": _Variable("ZCOLL_BARRIER", _barrier, FLAT, "context", "node barrier algorithm"),
        "eager_bytes": _Variable(
            "ZCOLL_EAGER_BYTES",
            _Number(),
            None,
            "context",
            "largest per-rank receive size of the eager path",
        ),
        "copy_threshold": _Variable(
            "ZCOLL_COPY_THRESHOLD",
            _Number(),
            None,
            "context",
            "initial hybrid-copy threshold T of copy='auto'",
        ),
        "cma_bytes": _Variable(
            "ZCOLL_CMA_BYTES",
            _Number(),
            None,
            "context",
            "bytes received per rank from which plain NumPy buffers are pulled by CMA",
        ),
        "cold_runs": _Variable(
            "ZCOLL_COLD_RUNS",
            _Number(),
            None,
            "context",
            "first runs of a zcoll.fft transpose on a new communicator that go through MPI",
        ),
        "spin": _Variable(
            "ZCOLL_SPIN", _Number(), None, "context", "busy polls of a wait before yielding"
        ),
        "yields": _Variable(
            "ZCOLL_YIELDS", _Number(), None, "context", "sched_yield polls before sleeping"
        ),
        "virtual_node_size": _Variable(
            "ZCOLL_VIRTUAL_NODE_SIZE",
            _Number(invalid="={text!r} is not an integer", negative=" must be >= 0"),
            0,
            "context",
            "ranks per virtual node (0: real nodes)",
        ),
        "node_pools": _Variable(
            "ZCOLL_NODE_POOLS",
            _one_of(("0", "1")),
            "1",
            "context",
            "1: a derived communicator's context takes a block of its parent's node pool",
        ),
        "tuning": _Variable(
            "ZCOLL_TUNING",
            _one_of(TUNING_MODES),
            "table",
            "first use",
            "what order/copy='auto' follow",
        ),
        "tuning_file": _Variable(
            "ZCOLL_TUNING_FILE",
            _path_or_default(_default_tuning_file),
            _default_tuning_file,
            "context",
            "the tuning table",
        ),
        "shared_heap": _Variable(
            "ZCOLL_SHARED_HEAP",
            _one_of(("0", "1")),
            "0",
            "import",
            "1: NumPy allocates array data on the node's shared heap (zcoll.use_shared_heap)",
        ),
        "copy_isa": _Variable(
            "ZCOLL_COPY_ISA", _copy_isa, "auto", "import", "streaming-copy kernel"
        ),
        "replay": _Variable(
            "ZCOLL_REPLAY",
            _path_or_default(_no_replay),
            None,
            "context",
            "zcoll_replay executable of bench cachemiss",
        ),
        "topology": _Variable(
            "ZCOLL_TOPOLOGY",
            _topology,
            None,
            "context",
            "machine described instead of this one (hwloc synthetic or XML)",
        ),
    }
)


class Reading(NamedTuple):
    """One variable as read: its value, where it came from, and its text (None when unset)."""

    value: Any
    source: str
    text: str | None = None


_CONTEXT_ENV = tuple(var.env for var in VARIABLES.values() if var.when == "context")
# The variables' raw values, read from the dict behind os.environ (which every change through
# os.environ or putenv-free code updates) without decoding each: a context's creation reads them
# all, and os.environ.get costs ~0.5 us a variable.
_ENV_BYTES: Any = getattr(os.environ, "_data", None)
if not isinstance(_ENV_BYTES, dict) or not all(isinstance(k, bytes) for k in _ENV_BYTES):
    _ENV_BYTES = os.environ  # not CPython on POSIX


def _raw_key(env: str) -> Any:
    return env if _ENV_BYTES is os.environ else os.fsencode(env)


_INPUT_KEYS: tuple = tuple(map(_raw_key, _CONTEXT_ENV + _CACHE_DIR_ENV))
# Each variable's key in _ENV_BYTES: an unset one is known without decoding the environment.
_ENV_KEYS = {name: _raw_key(var.env) for name, var in VARIABLES.items()}


def _env_text(name: str) -> str | None:
    """The text of setting `name`'s variable in this process's environment (None: unset)."""
    if _ENV_BYTES.get(_ENV_KEYS[name]) is None:
        return None
    return os.environ.get(VARIABLES[name].env)


def read(name: str, environ: Mapping[str, str] | None = None) -> Reading:
    """Read and parse the environment variable behind setting `name` (``os.environ`` by
    default) now; the only place zcoll reads a ``ZCOLL_*`` variable.

    Raises
    ------
    ValueError
        If the variable holds a value its setting does not accept.
    """
    var = VARIABLES[name]
    text = _env_text(name) if environ is None else environ.get(var.env)
    if text is None:
        default = var.default() if callable(var.default) else var.default
        return Reading(default, DEFAULT)
    return Reading(var.parse(var.env, text), ENVIRONMENT, text)


def zcoll_environment() -> dict[str, str]:
    """Every ``ZCOLL_*`` variable set in this process, as text (for run metadata)."""
    return {k: v for k, v in os.environ.items() if k.startswith("ZCOLL_")}


# --- what is in force ---------------------------------------------------------------------------

_AT_IMPORT = {name: read(name) for name, var in VARIABLES.items() if var.when == "import"}
_overrides: dict[str, Reading] = {}  # set_timeout's and set_tuning's choices
_override_count = 0  # changes with every override: a remembered settings() is then out of date


@functools.cache
def _first_use(name: str) -> Reading:
    return read(name)


def current(name: str) -> Reading:
    """Setting `name` in force: an override, else as read at import, on first use or now."""
    if name in _overrides:
        return _overrides[name]
    if name in _AT_IMPORT:
        return _AT_IMPORT[name]
    if VARIABLES[name].when == "first use":
        return _first_use(name)
    return read(name)


def override(name: str, value, source: str) -> None:
    """Put `value` in force for setting `name` (`source`: the function that set it)."""
    global _override_count
    _overrides[name] = Reading(value, source)
    _override_count += 1


def get_timeout() -> float:
    """Return the current peer-wait bound in seconds (see :func:`zcoll.set_timeout`)."""
    return current("timeout").value


def get_tuning() -> str:
    """Return the tuning mode: "table", "online" or "off" (see :func:`zcoll.set_tuning`)."""
    return current("tuning").value


# --- the machine --------------------------------------------------------------------------------


class _Fact(NamedTuple):
    value: Any
    source: str


def _cpu_model() -> _Fact:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model"):
                    return _Fact(value.strip(), "/proc/cpuinfo")
    except OSError:
        pass
    return _Fact(platform.processor() or platform.machine(), "platform")


@functools.cache
def machine() -> dict[str, _Fact]:
    """This machine's facts, read once: ``l2_bytes`` (a core's L2) and ``llc_bytes`` (the
    last-level cache) from hwloc, ``cpu_model`` and ``cpus``; each a (value, source) pair."""
    try:
        caches = _core.machine_topology()
    except (RuntimeError, OSError):
        l2_fact = _Fact(CACHE_FALLBACK[0], "fallback (hwloc failed)")
        llc_fact = _Fact(CACHE_FALLBACK[1], "fallback (hwloc failed)")
    else:
        l2, llc = int(caches.get("l2") or 0), int(caches.get("l3") or 0)
        l2_fact = _Fact(l2, "hwloc") if l2 else _Fact(CACHE_FALLBACK[0], "fallback (no L2)")
        llc_fact = _Fact(llc, "hwloc") if llc else _Fact(l2_fact.value, "L2 (no L3)")
    cpus = os.cpu_count()
    mpi = _mpi_library.libraries()
    return {
        "l2_bytes": l2_fact,
        "llc_bytes": llc_fact,
        "cpu_model": _cpu_model(),
        "cpus": _Fact(cpus or 1, "os.cpu_count()" if cpus else "fallback"),
        "mpi_library": _Fact(mpi.zcoll, "build"),
        "mpi4py_library": _Fact(mpi.mpi4py, "mpi4py"),
        "mpi_libraries_match": _Fact(mpi.match, "MPI_Get_library_version"),
        "cma": _Fact(_core.cma_kernel_status(), "process_vm_readv"),
    }


# --- the settings object ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Settings:
    """What zcoll reads from the environment and the machine, as in force (see
    :func:`zcoll.settings`). ``None`` in `eager_bytes`, `copy_threshold`, `spin` and `yields`:
    the built-in default, which depends on the node (see the ``*_for`` methods).

    Attributes
    ----------
    timeout : float
        Seconds a rank waits for a peer (``ZCOLL_TIMEOUT``, :func:`zcoll.set_timeout`).
    barrier : str
        Node barrier algorithm (``ZCOLL_BARRIER``): flat, central or dissemination.
    eager_bytes, copy_threshold, spin, yields : int or None
        ``ZCOLL_EAGER_BYTES``, ``ZCOLL_COPY_THRESHOLD``, ``ZCOLL_SPIN``, ``ZCOLL_YIELDS``.
    cma_bytes : int or None
        ``ZCOLL_CMA_BYTES``: an exchange with a buffer outside shared memory (a plain NumPy
        array) in which each rank (an irregular call: its busiest rank) receives at least this
        many bytes pulls the blocks from the senders' memory by CMA (``process_vm_readv``, one
        copy); smaller calls take the eager slots where they hold them (two copies), else
        are staged through the arena (three copies). A bcast and the reductions pull from
        their own defaults (1 and 4 MiB, where staging stops being faster), scaled by this
        value's ratio to the default (16 KiB). None: the measured defaults.
    cold_runs : int or None
        ``ZCOLL_COLD_RUNS``: how many first runs of a :class:`zcoll.fft.PFFT`'s or
        :class:`zcoll.fft.pencil.Transfer`'s transposes go through MPI (an ``Alltoallw`` of
        subarray datatypes, as in mpi4py-fft) while their communicators have no zcoll context,
        before zcoll makes the contexts and persistent plans. None: as many as cost less
        together than that set-up (``_core.cold_transfer_runs``); 0: zcoll's from the first
        run.
    virtual_node_size : int
        ``ZCOLL_VIRTUAL_NODE_SIZE`` (0: nodes are the machines).
    node_pools : str
        ``ZCOLL_NODE_POOLS``: "1" (the default): the context of a communicator whose ranks all
        belong to an earlier context's (a Dup, Split, Create_cart, Sub) takes a block of that
        context's node pool, one small agreement instead of a full creation; "0": every context
        is made in full (its own node split and segments).
    tuning : str
        ``ZCOLL_TUNING`` or :func:`zcoll.set_tuning`: table, online or off.
    tuning_file : pathlib.Path
        ``ZCOLL_TUNING_FILE``, else ``tuning.json`` in the user's cache directory.
    shared_heap : str
        ``ZCOLL_SHARED_HEAP``: "1" switches :func:`zcoll.use_shared_heap` on at import (0: off).
    copy_isa : str
        ``ZCOLL_COPY_ISA``: the streaming-copy kernel asked for ("auto": the best one).
    replay : pathlib.Path or None
        ``ZCOLL_REPLAY``: the ``zcoll_replay`` executable (None: the installed one).
    topology : str or None
        ``ZCOLL_TOPOLOGY``: an hwloc synthetic description (``"package:2 numa:2 core:4 pu:1"``)
        or the path of an hwloc XML file, used instead of this machine: node rank i is placed on
        its i-th PU (wrapping), which gives it its package, NUMA node, L3 and core (None: this
        machine, where each rank runs). Only the placement: cache sizes stay this machine's.
    l2_bytes, llc_bytes : int
        A core's L2 and the last-level cache, in bytes (hwloc).
    cpu_model : str
        The CPU model.
    cpus : int
        Logical CPUs of this machine.
    mpi_library : str
        The MPI library zcoll's extension was built against (its version line, link line and
        what chose it: MPI_C_COMPILER, MPICC or mpi4py), or "none".
    mpi4py_library : str
        The MPI library mpi4py runs on (version line and path).
    mpi_libraries_match : bool
        Whether the extension runs on mpi4py's library (the same one, initialized), which it
        calls for the messages between nodes; if not, calls on a communicator spanning several
        nodes raise.
    cma : str
        Whether the kernel lets ranks read each other's memory (``process_vm_readv``):
        "available", or why not (Yama's ``ptrace_scope``, no system call). Where it does not,
        plain NumPy buffers are staged at every size.
    sources : mapping
        Field name -> where its value came from ("default", "environment", "set_timeout", ...).
    """

    timeout: float
    barrier: str
    eager_bytes: int | None
    copy_threshold: int | None
    cma_bytes: int | None
    cold_runs: int | None
    spin: int | None
    yields: int | None
    virtual_node_size: int
    node_pools: str
    tuning: str
    tuning_file: Path
    shared_heap: str
    copy_isa: str
    replay: Path | None
    topology: str | None
    l2_bytes: int
    llc_bytes: int
    cpu_model: str
    cpus: int
    mpi_library: str
    mpi4py_library: str
    mpi_libraries_match: bool
    cma: str
    sources: Mapping[str, str] = dataclasses.field(
        default_factory=dict, compare=False, hash=False, repr=False
    )

    def replace(self, source: str, **changes) -> Settings:
        """A copy with `changes`, which came from `source`."""
        sources = {**self.sources, **dict.fromkeys(changes, source)}
        return dataclasses.replace(self, **changes, sources=MappingProxyType(sources))

    def eager_bytes_for(self, oversubscribed: bool) -> int:
        """Largest per-rank receive size that order="auto" sends through the eager path."""
        if self.eager_bytes is not None:
            return self.eager_bytes
        return OVERSUBSCRIBED_EAGER_BYTES if oversubscribed else DEFAULT_EAGER_BYTES

    def placement(self, node_rank: int) -> dict:
        """Where node rank `node_rank` runs, as ``_core.locate_this_process()`` describes it:
        on the described machine's PU `node_rank` (wrapping) when ``topology`` is set, else
        where this process runs now."""
        if self.topology is None:
            return _core.locate_this_process()
        return _core.locate_described_pu(self.topology, node_rank)

    def copy_threshold_for(self, node_size: int) -> int:
        """Initial hybrid-copy threshold: L2 / ranks per node unless set."""
        if self.copy_threshold is not None:
            return self.copy_threshold
        return self.l2_bytes // node_size

    def wait_for(self, oversubscribed: bool) -> dict:
        """The arguments of ``NodeContext.set_wait``: timeout, spin, yields, sleep_slice."""
        spin, yields = self.spin, self.yields
        if spin is None:
            spin = OVERSUBSCRIBED_SPIN if oversubscribed else DEFAULT_SPIN
        if yields is None:
            yields = OVERSUBSCRIBED_YIELDS if oversubscribed else DEFAULT_YIELDS
        return {"timeout": self.timeout, "spin": spin, "yields": yields, "sleep_slice": SLEEP_SLICE}

    def __str__(self) -> str:
        rows = [("setting", "value", "from")]
        for f in dataclasses.fields(self):
            if f.name == "sources":
                continue
            source = self.sources.get(f.name, "")
            if f.name in VARIABLES and source == ENVIRONMENT:
                source = f"environment ({VARIABLES[f.name].env})"
            rows.append((f.name, _shown(f.name, getattr(self, f.name)), source))
        widths = [max(len(row[i]) for row in rows) for i in range(2)]
        lines = ["zcoll settings"]
        lines += [f"  {a:<{widths[0]}}  {b:<{widths[1]}}  {c}".rstrip() for a, b, c in rows]
        return "\n".join(lines)


_BUILT_IN = {
    "eager_bytes": f"auto ({DEFAULT_EAGER_BYTES}; {OVERSUBSCRIBED_EAGER_BYTES} oversubscribed)",
    "copy_threshold": "auto (L2 / ranks per node)",
    "cma_bytes": f"auto ({_core.default_cma_bytes // 1024} KiB; bcast from "
    f"{_core.builtin_pull_bytes('bcast') // 1024} KiB, reductions from "
    f"{_core.builtin_pull_bytes('allreduce') // 1024} KiB, or the tuning table's)",
    "cold_runs": "auto (while cheaper than the set-up)",
    "spin": f"auto ({DEFAULT_SPIN}; {OVERSUBSCRIBED_SPIN} oversubscribed)",
    "yields": f"auto ({DEFAULT_YIELDS}; {OVERSUBSCRIBED_YIELDS} oversubscribed)",
    "virtual_node_size": "0 (off)",
    "replay": "the installed zcoll_replay",
    "topology": "this machine",
}


def _shown(name: str, value) -> str:
    if value is None or (name == "virtual_node_size" and value == 0):
        return _BUILT_IN[name]
    if name == "timeout":
        return f"{value:g} s"
    if name in ("l2_bytes", "llc_bytes"):
        return _bytes_text(value)
    if name == "copy_isa" and value == AUTO:
        return f"auto ({_core.best_copy_isa()})"
    return str(value)


def _bytes_text(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def settings() -> Settings:
    """Return the settings in force: zcoll's environment variables, the machine facts, and the
    choices made with :func:`zcoll.set_timeout` and :func:`zcoll.set_tuning`.

    Local (no MPI). Variables read when a communicator's context is created (all but
    ``ZCOLL_TIMEOUT`` and ``ZCOLL_COPY_ISA``, read at import, and ``ZCOLL_TUNING``, read on
    first use) are read now: the result is what a context created now would use.
    ``print(zcoll.settings())`` shows a table of every setting, its value and where it came
    from.

    Returns
    -------
    Settings
        A frozen dataclass: ``timeout``, ``barrier``, ``eager_bytes``, ``copy_threshold``,
        ``spin``, ``yields`` (None: the built-in default for the node), ``virtual_node_size``,
        ``tuning``, ``tuning_file``, ``copy_isa``, ``replay``, ``topology``, the machine's
        ``l2_bytes``,
        ``llc_bytes``, ``cpu_model`` and ``cpus``, the MPI libraries (``mpi_library``,
        ``mpi4py_library``, ``mpi_libraries_match``), and ``sources`` (where each came from).

    Raises
    ------
    ValueError
        If a ``ZCOLL_*`` variable holds a value zcoll does not accept (the same message as when
        zcoll itself reads it).

    Examples
    --------
    >>> import zcoll
    >>> zcoll.settings().timeout  # doctest: +SKIP
    60.0
    >>> print(zcoll.settings())  # doctest: +SKIP
    """
    global _remembered
    inputs = _settings_inputs()
    if _remembered is not None and _remembered[0] == inputs:
        return _remembered[1]
    made = _make_settings()
    _remembered = (inputs, made)  # only once made: a bad value raises again on the next call
    return made


# Every context reads the settings, and parsing every variable costs ~70 us: settings() keeps
# its last result with what it depends on that can change while the process runs (the
# variables read at context creation, those the default tuning file and "~" depend on, the
# overrides, and a ZCOLL_TOPOLOGY file, which is checked by loading it), and returns it again
# while they are the same. The rest is fixed: read at import or first use, or machine facts.
_remembered: tuple[tuple, Settings] | None = None


def _settings_inputs() -> tuple:
    texts = tuple(map(_ENV_BYTES.get, _INPUT_KEYS))
    topology = _env_text("topology")
    return texts, _override_count, _file_state(topology) if topology else None


def _file_state(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path.strip())
    except (OSError, ValueError):  # not a file (a synthetic description), or a bad name
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


def _make_settings() -> Settings:
    readings = {name: current(name) for name in VARIABLES}
    facts = machine()
    sources = {name: r.source for name, r in readings.items()}
    sources.update((name, fact.source) for name, fact in facts.items())
    return Settings(
        **{name: r.value for name, r in readings.items()},
        **{name: fact.value for name, fact in facts.items()},
        sources=MappingProxyType(sources),
    )
