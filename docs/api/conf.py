"""Sphinx configuration of zcoll's API reference, built from the numpydoc docstrings.

    python3 -m sphinx -W --keep-going -b html docs/api build/docs

The pages document the Python files of this checkout (python/zcoll), imported with the compiled
extension ``zcoll._core`` of the installed zcoll (``pip install .``): a docstring edited here
shows without a rebuild. Every name in ``zcoll.__all__`` and ``zcoll.fft.__all__`` must appear
in an ``auto*`` directive of these pages, else the build warns (and ``-W`` fails it).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE = HERE.parent.parent / "python" / "zcoll"


def _import_checkout() -> None:
    """Imports zcoll from PACKAGE, finding submodules there first and then in the installed
    package (where ``_core``, the compiled extension, is)."""
    installed = importlib.util.find_spec("zcoll")
    if installed is None or not installed.submodule_search_locations:
        raise RuntimeError("zcoll is not installed: pip install . first (the docs need _core)")
    locations = [str(PACKAGE), *installed.submodule_search_locations]
    spec = importlib.util.spec_from_file_location(
        "zcoll", PACKAGE / "__init__.py", submodule_search_locations=locations
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["zcoll"] = module
    spec.loader.exec_module(module)


_import_checkout()
import zcoll  # noqa: E402  (the checkout's, imported above)
import zcoll.fft  # noqa: E402

project = "zcoll"
author = "zcoll developers"
copyright = "zcoll developers, BSD 3-Clause"  # noqa: A001  (Sphinx's name)
release = version = zcoll.__version__

extensions = ["sphinx.ext.autodoc", "sphinx.ext.autosummary", "numpydoc"]
exclude_patterns: list[str] = []
html_theme = "alabaster"
html_static_path: list[str] = []

autodoc_default_options = {"member-order": "bysource"}
autodoc_typehints = "none"  # the signatures and numpydoc's Parameters say it once each
autosummary_generate = False  # no generated files in the source tree
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

_DIRECTIVE = re.compile(r"^\.\. auto(?:function|class|data|module|exception)::\s+(\S+)", re.M)


def _documented() -> set[str]:
    names: set[str] = set()
    for page in HERE.glob("*.rst"):
        names.update(_DIRECTIVE.findall(page.read_text()))
    return names


def _check_public_api(app) -> None:
    """Warns about every public name no page documents."""
    from sphinx.util import logging

    documented = _documented()
    logger = logging.getLogger("zcoll.api")
    for module in (zcoll, zcoll.fft):
        for name in module.__all__:
            if f"{module.__name__}.{name}" not in documented:
                logger.warning("%s.%s is in __all__ but on no page", module.__name__, name)


def setup(app):
    app.connect("builder-inited", _check_public_api)
