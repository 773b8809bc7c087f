"""Sphinx configuration of lit_fedco's documentation (``sphinx-build -W -b html docs OUT``)."""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(DOCS.parent))

import lit_fedco  # noqa: E402

project = "lit_fedco"
author = "lit_fedco contributors"
copyright = "2026, lit_fedco contributors"
release = lit_fedco.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "config_keys",  # docs/_ext: the config reference, generated from schema.json
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "_generated"]
myst_enable_extensions = ["colon_fence", "dollarmath", "deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_attr_annotations = True

html_theme = "furo"
html_title = f"lit_fedco {release}"
