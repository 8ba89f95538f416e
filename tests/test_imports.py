"""No import cycles among zcoll's modules, counting lazy (function-level) imports too.

The import graph comes from grimp (the library behind import-linter), which reads every
``import`` statement of the package, inside functions as well. A cycle exists where a module A
imports B and B leads back to A: grimp answers both questions (direct imports, chains).

One correction: grimp does not see compiled extension modules, so ``from . import _core``
(the C++ core) reads to it as an import of the package ``zcoll`` itself, that is of
``zcoll/__init__.py`` and everything it imports. Such a line only reaches a submodule: it is
rewritten into an import of ``zcoll._core`` before cycles are looked for.
"""

from __future__ import annotations

import ast
import copy
import importlib.machinery
import importlib.util

import pytest

grimp = pytest.importorskip("grimp")

PACKAGE = "zcoll"


def _is_extension(module: str) -> bool:
    spec = importlib.util.find_spec(module)
    origin = spec.origin if spec is not None else None
    return bool(origin) and origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def _submodules_named(graph, package: str, line: str) -> list[str] | None:
    """The submodules of `package` that the import statement `line` takes from it (``from
    package import a, b``), or None when it takes anything else (or is not one line)."""
    try:
        (statement,) = ast.parse(line.strip()).body
    except (SyntaxError, ValueError):
        return None
    if not isinstance(statement, ast.ImportFrom):
        return None
    names = [f"{package}.{alias.name}" for alias in statement.names]
    if all(name in graph.modules or _is_extension(name) for name in names):
        return names
    return None


def import_graph():
    """zcoll's import graph, with imports of extension modules made explicit."""
    graph = grimp.build_graph(PACKAGE, cache_dir=None)
    packages = [m for m in graph.modules if graph.find_children(m)]
    for package in packages:
        for importer in graph.find_modules_that_directly_import(package):
            details = graph.get_import_details(importer=importer, imported=package)
            named = [_submodules_named(graph, package, d["line_contents"]) for d in details]
            if details and all(names is not None for names in named):
                graph.remove_import(importer=importer, imported=package)
                for module in {m for names in named for m in names}:
                    if module not in graph.modules:
                        graph.add_module(module)
                    graph.add_import(importer=importer, imported=module)
    return graph


def find_cycles(graph) -> list[tuple[str, ...]]:
    """Every import cycle, once each: ``(a, b, ..., a)``, `a` importing `b`."""
    cycles = {}
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back is not None:
                cycle = (importer, *back)
                cycles.setdefault(frozenset(cycle), cycle)
    return sorted(cycles.values())


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_no_import_cycles(graph):
    cycles = find_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_graph_sees_what_matters(graph):
    # Imports inside functions count: the bench CLI imports zcoll.fft in _fft_options only.
    assert graph.direct_import_exists(importer="zcoll.bench.cli", imported="zcoll.fft")
    # The C++ core is a module of its own, and importing it is not importing the package.
    assert graph.direct_import_exists(importer="zcoll._registry", imported="zcoll._core")
    assert not graph.direct_import_exists(importer="zcoll._registry", imported="zcoll")
    # Every module is there, the moved and new ones included.
    for module in (
        "zcoll._context",
        "zcoll._exit",
        "zcoll._node",
        "zcoll._settings",
        "zcoll._transport",
        "zcoll._timing",
        "zcoll._tuning",
        "zcoll.bench.cachemiss",
        "zcoll.bench.output",
        "zcoll.tune",
    ):
        assert module in graph.modules, module
    # zcoll.cachemiss is only an entry point (the command the NUMA issue names): the replay
    # itself lives under zcoll.bench.
    imported = graph.find_modules_directly_imported_by("zcoll.cachemiss")
    assert imported == {"zcoll.bench.cachemiss"}, imported


def test_a_cycle_is_found(graph):
    """The check can fail: a lazy import of the context from the registry closes a loop."""
    graph = copy.deepcopy(graph)
    graph.add_import(importer="zcoll._registry", imported="zcoll._context")
    cycles = find_cycles(graph)
    assert ("zcoll._context", "zcoll._registry", "zcoll._context") in cycles, cycles


def test_the_tuner_does_not_import_the_bench(graph):
    bench = {m for m in graph.modules if m == "zcoll.bench" or m.startswith("zcoll.bench.")}
    reached = graph.find_upstream_modules("zcoll.tune")
    assert not reached & bench, sorted(reached & bench)
