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

# Types are read from the signatures; listing them again under each parameter adds nothing.
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented"
autodoc_member_order = "bysource"
autodoc_default_options = {"show-inheritance": True}
# vLLM is CUDA-only and not installed here; the package imports it only inside what runs on Ray.
autodoc_mock_imports = ["vllm"]

html_theme = "furo"
html_title = "airflow-provider-raybatch"
