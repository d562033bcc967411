"""Sphinx configuration of the documentation site (`make docs`; tests/test_docs.py builds it with -W)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The package documented is this checkout's, whatever is installed.
sys.path.insert(0, str(ROOT))

project = "airflow-provider-raybatch"
author = "airflow-provider-raybatch contributors"
copyright = "the airflow-provider-raybatch contributors"
release = "0.1.0"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.viewcode",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "snippets", "Thumbs.db", ".DS_Store"]

# MyST: ```{directive} fences and ::: fences, heading anchors for links such as page.md#section.
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# Type hints go into each documented parameter's description (the docstrings' :param x: fields), which keeps
# the operators' signatures of twenty-odd arguments readable; undocumented parameters get no entry of their own.
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented"
autodoc_member_order = "bysource"
autodoc_default_options = {"show-inheritance": True}

html_theme = "furo"
html_title = "airflow-provider-raybatch"
