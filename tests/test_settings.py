"""zcoll.settings(): every environment variable and machine fact zcoll reads, in one place.

Variables read when a context is created are changed here with monkeypatch (``settings()``
reads them anew); those read at import (``ZCOLL_TIMEOUT``, ``ZCOLL_COPY_ISA``) are checked in
a fresh Python process, started without the launcher's variables and without initialising MPI
(a child of an mpiexec rank cannot join that job). Error messages are compared in full.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest
from mpi4py import MPI

import zcoll
from helpers import all_ranks_agree, fresh_python
from zcoll import _context, _core, _settings, _tuning

WORLD = MPI.COMM_WORLD
CONTEXT_VARIABLES = [v.env for v in _settings.VARIABLES.values() if v.when == "context"]


@pytest.fixture
def clean_env(monkeypatch):
    """No ZCOLL_* variable read at context creation is set (restored afterwards)."""
    for name in CONTEXT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def exact(message: str) -> str:
    return "^" + re.escape(message) + "$"


# --- defaults ----------------------------------------------------------------------------------


def test_defaults(clean_env):
    s = zcoll.settings()
    assert isinstance(s, zcoll.Settings)
    assert (s.barrier, s.virtual_node_size, s.replay) == ("flat", 0, None)
    assert (s.eager_bytes, s.copy_threshold, s.spin, s.yields) == (None, None, None, None)
    assert s.tuning_file.name == "tuning.json" and "zcoll" in s.tuning_file.parts
    assert s.tuning_file == zcoll.tuning_path()
    for name in ("barrier", "eager_bytes", "copy_threshold", "spin", "yields", "tuning_file"):
        assert s.sources[name] == "default", name
    # The built-in values, which depend on the node.
    assert s.eager_bytes_for(False) == 4096 and s.eager_bytes_for(True) == 16384
    assert s.wait_for(False) == {"timeout": s.timeout, "spin": 4096, "yields": 64,
                                 "sleep_slice": 0.02}  # fmt: skip
    assert s.wait_for(True) == {"timeout": s.timeout, "spin": 0, "yields": 20000,
                                "sleep_slice": 0.02}  # fmt: skip
    assert s.copy_threshold_for(4) == s.l2_bytes // 4


def test_machine_facts():
    s = zcoll.settings()
    caches = _core.machine_topology()
    if caches.get("l2"):
        assert (s.l2_bytes, s.sources["l2_bytes"]) == (caches["l2"], "hwloc")
    if caches.get("l3"):
        assert (s.llc_bytes, s.sources["llc_bytes"]) == (caches["l3"], "hwloc")
    assert s.l2_bytes > 0 and s.llc_bytes > 0
    assert s.cpus == (os.cpu_count() or 1)
    machine = _tuning.current_machine()  # what a tuning table records comes from here too
    assert (machine["cpu_model"], machine["l2_bytes"], machine["l3_bytes"]) == (
        s.cpu_model,
        s.l2_bytes,
        s.llc_bytes,
    )


def test_cma_shows_what_the_kernel_allows():
    """settings().cma says whether ranks may read each other's memory, as the kernel's Yama
    setting has it (a scope other than 0 refuses reads between sibling processes, which is what
    ranks under one mpiexec are), and its table names it."""
    yama = Path("/proc/sys/kernel/yama/ptrace_scope")
    scope = yama.read_text().strip() if yama.exists() else "0"
    s = zcoll.settings()
    if scope == "0":
        assert s.cma == "available", s.cma
    else:
        assert s.cma == f"refused between sibling ranks (kernel.yama.ptrace_scope = {scope})"
    assert s.sources["cma"] == "process_vm_readv"
    assert re.search(r"\bcma\b.*" + re.escape(s.cma), str(s)), str(s)


def test_context_uses_the_defaults(clean_env):
    c = WORLD.Dup()
    try:
        ctx = _context.context(c)
        s = ctx.settings
        assert ctx.core.eager_bytes == s.eager_bytes_for(ctx.oversubscribed)
        assert ctx.core.copy_cache == s.llc_bytes
        # Every rank under this kernel shares its CPUs, whatever node MPI puts it on (emulated
        # nodes: one machine, several nodes).
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text()
        on_machine = c.allgather(boot_id).count(boot_id)
        assert on_machine >= ctx.node_size
        assert ctx.oversubscribed == (on_machine > s.cpus)
    finally:
        c.Free()


# --- the environment ---------------------------------------------------------------------------


def test_environment_is_parsed(clean_env, tmp_path):
    values = {
        "ZCOLL_BARRIER": "dissemination",
        "ZCOLL_EAGER_BYTES": "0",
        "ZCOLL_COPY_THRESHOLD": " 12345 ",
        "ZCOLL_SPIN": "7",
        "ZCOLL_YIELDS": "9",
        "ZCOLL_VIRTUAL_NODE_SIZE": "3",
        "ZCOLL_TUNING_FILE": str(tmp_path / "t.json"),
        "ZCOLL_REPLAY": "/bin/true",
    }
    for name, value in values.items():
        clean_env.setenv(name, value)
    s = zcoll.settings()
    assert s.barrier == "dissemination"
    assert (s.eager_bytes, s.copy_threshold, s.spin, s.yields) == (0, 12345, 7, 9)
    assert s.virtual_node_size == 3
    assert s.tuning_file == tmp_path / "t.json" == zcoll.tuning_path()
    assert str(s.replay) == "/bin/true"
    for name, var in _settings.VARIABLES.items():
        if var.env in values:
            assert s.sources[name] == "environment", name
    assert s.eager_bytes_for(True) == 0 and s.copy_threshold_for(8) == 12345
    assert s.wait_for(True) == {"timeout": s.timeout, "spin": 7, "yields": 9, "sleep_slice": 0.02}
    text = str(s)
    assert re.search(r"barrier\s+dissemination\s+environment \(ZCOLL_BARRIER\)", text), text
    assert re.search(r"eager_bytes\s+0\s+environment \(ZCOLL_EAGER_BYTES\)", text), text


def test_context_follows_the_environment(clean_env):
    clean_env.setenv("ZCOLL_EAGER_BYTES", "2048")  # a multiple of 256: kept as is
    clean_env.setenv("ZCOLL_COPY_THRESHOLD", "8192")
    clean_env.setenv("ZCOLL_BARRIER", "central")
    c = WORLD.Dup()
    try:
        ctx = _context.context(c)
        ok = ctx.core.eager_bytes == 2048 and ctx.settings.barrier == "central"
        ok &= ctx.settings.copy_threshold_for(ctx.node_size) == 8192
        all_ranks_agree(c, ok, f"{ctx.settings!r}, eager {ctx.core.eager_bytes}")
        got = zcoll.allgather(c, [c.rank])  # the central barrier works
        all_ranks_agree(c, got.ravel().tolist() == list(range(c.size)), f"{got}")
    finally:
        c.Free()
    clean_env.delenv("ZCOLL_EAGER_BYTES")
    c = WORLD.Dup()
    try:  # a context made later reads the environment again
        ctx = _context.context(c)
        all_ranks_agree(c, ctx.core.eager_bytes == ctx.settings.eager_bytes_for(
            ctx.oversubscribed), "default again")  # fmt: skip
    finally:
        c.Free()


def test_settings_follow_the_cache_directory(clean_env, tmp_path):
    # settings() is remembered between calls: what the default tuning file depends on counts.
    for name in ("a", "b"):
        clean_env.setenv("XDG_CACHE_HOME", str(tmp_path / name))
        want = tmp_path / name / "zcoll" / "tuning.json"
        assert zcoll.settings().tuning_file == want == zcoll.tuning_path()


BAD_VALUES = [
    ("ZCOLL_BARRIER", "spin",
     "zcoll: ZCOLL_BARRIER must be one of ['central', 'dissemination', 'flat'], got 'spin'"),
    ("ZCOLL_BARRIER", "", "zcoll: ZCOLL_BARRIER must be one of "
     "['central', 'dissemination', 'flat'], got ''"),
    ("ZCOLL_EAGER_BYTES", "4K", "zcoll: ZCOLL_EAGER_BYTES='4K' is not a valid int"),
    ("ZCOLL_COPY_THRESHOLD", "", "zcoll: ZCOLL_COPY_THRESHOLD='' is not a valid int"),
    ("ZCOLL_SPIN", "-1", "zcoll: ZCOLL_SPIN must be >= 0, got '-1'"),
    ("ZCOLL_YIELDS", "1.5", "zcoll: ZCOLL_YIELDS='1.5' is not a valid int"),
    ("ZCOLL_VIRTUAL_NODE_SIZE", "two", "zcoll: ZCOLL_VIRTUAL_NODE_SIZE='two' is not an integer"),
    ("ZCOLL_VIRTUAL_NODE_SIZE", "-2", "zcoll: ZCOLL_VIRTUAL_NODE_SIZE must be >= 0"),
    ("ZCOLL_TOPOLOGY", "socket:two", "zcoll: ZCOLL_TOPOLOGY: hwloc rejects 'socket:two' as a "
     "synthetic description (nor is it a file)"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "value", "message"), BAD_VALUES)
def test_bad_values_raise(name, value, message, clean_env):
    clean_env.setenv(name, value)
    with pytest.raises(ValueError, match=exact(message)):
        zcoll.settings()
    c = WORLD.Dup()
    try:  # on every rank, before any communication: nothing is left half made
        with pytest.raises(ValueError, match=exact(message)):
            _context.context(c)
    finally:
        c.Free()


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("timeout", "abc", "zcoll: ZCOLL_TIMEOUT='abc' is not a valid float"),
        ("timeout", "0", "zcoll: ZCOLL_TIMEOUT must be positive, got '0'"),
        ("timeout", "-3", "zcoll: ZCOLL_TIMEOUT must be positive, got '-3'"),
        ("timeout", "nan", "zcoll: ZCOLL_TIMEOUT must be positive, got 'nan'"),
        ("tuning", "Sometimes", "zcoll: ZCOLL_TUNING must be one of "
         "('table', 'online', 'off'), got 'sometimes'"),
    ],
)  # fmt: skip
def test_bad_values_of_variables_read_once(name, text, message):
    env = _settings.VARIABLES[name].env
    with pytest.raises(ValueError, match=exact(message)):
        _settings.read(name, {env: text})


def test_read_normalises():
    read = _settings.read
    assert read("timeout", {"ZCOLL_TIMEOUT": " 2.5 "}) == (2.5, "environment", " 2.5 ")
    assert read("timeout", {}) == (60.0, "default", None)
    assert read("tuning", {"ZCOLL_TUNING": " ONLINE "}).value == "online"
    assert read("tuning", {"ZCOLL_TUNING": ""}).value == "table"
    assert read("copy_isa", {"ZCOLL_COPY_ISA": " AVX2 "}).value == "avx2"
    assert read("copy_isa", {"ZCOLL_COPY_ISA": ""}).value == "auto"
    assert read("tuning_file", {"ZCOLL_TUNING_FILE": "~/t.json"}).value.is_absolute()
    assert read("tuning_file", {"ZCOLL_TUNING_FILE": ""}).value == read("tuning_file", {}).value


# --- set_timeout and set_tuning -----------------------------------------------------------------


def test_set_timeout_is_reflected():
    saved = zcoll.get_timeout()
    c = WORLD.Dup()
    ctx = _context.context(c)
    try:
        zcoll.set_timeout(12.5)
        s = zcoll.settings()
        assert (s.timeout, s.sources["timeout"]) == (12.5, "set_timeout")
        assert zcoll.get_timeout() == 12.5
        assert (ctx.settings.timeout, ctx.settings.sources["timeout"]) == (12.5, "set_timeout")
        assert re.search(r"timeout\s+12\.5 s\s+set_timeout", str(s)), str(s)
        with pytest.raises(ValueError, match=exact("zcoll.set_timeout: seconds must be positive")):
            zcoll.set_timeout(0)
        assert zcoll.settings().timeout == 12.5
    finally:
        zcoll.set_timeout(saved)
        c.Free()
    assert zcoll.settings().timeout == saved


def test_set_tuning_is_reflected():
    c = WORLD.Dup()
    ctx = _context.context(c)
    previous = zcoll.set_tuning("off")
    try:
        s = zcoll.settings()
        assert (s.tuning, s.sources["tuning"]) == ("off", "set_tuning")
        assert zcoll.get_tuning() == "off"
        assert ctx.settings.tuning == "off" and not ctx.core.online_tuning
        assert zcoll.set_tuning("online") == "off"
        assert ctx.settings.tuning == "online"
        assert ctx.core.online_tuning == (not ctx.multi_node)  # one node only
        assert re.search(r"tuning\s+online\s+set_tuning", str(zcoll.settings()))
        with pytest.raises(ValueError, match="zcoll.set_tuning: mode must be one of"):
            zcoll.set_tuning("sometimes")
        assert zcoll.get_tuning() == "online"
    finally:
        zcoll.set_tuning(previous)
        c.Free()
    assert zcoll.get_tuning() == previous


def test_settings_object():
    s = zcoll.settings()
    assert "settings" in zcoll.__all__ and "Returns" in zcoll.settings.__doc__
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.timeout = 1.0
    t = s.replace("test", timeout=3.0)
    assert (t.timeout, t.sources["timeout"], s.sources["timeout"]) == (
        3.0,
        "test",
        zcoll.settings().sources["timeout"],
    )
    assert t != s and s == zcoll.settings()
    lines = str(s).splitlines()
    names = [f.name for f in dataclasses.fields(s) if f.name != "sources"]
    assert lines[0] == "zcoll settings" and len(lines) == len(names) + 2
    for name, line in zip(names, lines[2:]):
        assert line.split()[0] == name and line.split()[-1], line


# --- read at import: a fresh process ------------------------------------------------------------


only_once = pytest.mark.skipif(WORLD.size > 1, reason="one process: runs in the P = 1 run only")


@only_once
def test_import_time_variables():
    code = """
        import json, os
        import zcoll
        from zcoll import _core
        os.environ["ZCOLL_TIMEOUT"] = "3"  # too late: read at import
        os.environ["ZCOLL_TUNING"] = "online"  # too late: read on first use, just below
        s = zcoll.settings()
        os.environ["ZCOLL_TUNING"] = "table"
        print(json.dumps([s.timeout, s.sources["timeout"], s.copy_isa, _core.active_copy_isa(),
                          s.tuning, zcoll.get_tuning(), zcoll.get_timeout()]))
    """
    proc = fresh_python(code, ZCOLL_TIMEOUT="7.5", ZCOLL_COPY_ISA=" Portable ")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got == [7.5, "environment", "portable", "portable", "online", "online", 7.5]


@only_once
@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("ZCOLL_TIMEOUT", "soon", "ValueError: zcoll: ZCOLL_TIMEOUT='soon' is not a valid float"),
        ("ZCOLL_COPY_ISA", "bogus", "ValueError: ZCOLL_COPY_ISA='bogus': "),
    ],
)
def test_bad_import_time_values_fail_the_import(name, value, message):
    proc = fresh_python("import zcoll", **{name: value})
    assert proc.returncode != 0
    assert message in proc.stderr.splitlines()[-1], proc.stderr


@only_once
def test_bad_tuning_mode_fails_on_first_use():
    code = """
        import zcoll  # the import does not read ZCOLL_TUNING
        try:
            zcoll.settings()
        except ValueError as exc:
            print(exc)
    """
    proc = fresh_python(code, ZCOLL_TUNING="fast")
    assert proc.returncode == 0, proc.stderr
    want = "zcoll: ZCOLL_TUNING must be one of ('table', 'online', 'off'), got 'fast'"
    assert proc.stdout.strip() == want
