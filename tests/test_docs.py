"""The documentation site: it builds without a warning, and every code example in it runs.

Pages never type Python: they include it from files a test runs (the example DAGs in dags/, the
DAG files and the example package of docs/snippets/, tests/support/tgi_engine.py). This module
parses each docs/snippets/*.py as the DAG processor would, runs the example predictors the way a
stage does, builds the site with warnings as errors, and checks that the README's Python blocks
are copies of those files.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pytest

from tests.conftest import REPO
from tests.support.dag_files import parse_dag_files

DOCS = REPO / "docs"
SNIPPETS = DOCS / "snippets"
SNIPPET_DAG_FILES = sorted(SNIPPETS.glob("*.py"))
#: What a DAG file must not import at parse time (a DAG processor parses it often).
HEAVY_MODULES = ("ray", "torch", "transformers", "vllm")
#: Where included code may come from: files that a test runs.
TESTED_SOURCES = (REPO / "dags", SNIPPETS, REPO / "tests")


def test_the_site_builds_without_warnings(tmp_path):
    """As `make docs` builds it: every page, include, cross-reference and docstring, -W."""
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(tmp_path / "html")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    assert (tmp_path / "html" / "index.html").is_file()
    assert (tmp_path / "html" / "api.html").read_text().count('class="sig-name descname"') > 50  # autodoc ran


def test_snippet_dag_files_parse_cleanly_without_heavy_imports():
    """Each docs/snippets/*.py is a DAG file: parsed in a fresh interpreter, as a DAG processor does."""
    assert len(SNIPPET_DAG_FILES) >= 5, SNIPPET_DAG_FILES
    parsed = parse_dag_files(SNIPPET_DAG_FILES, HEAVY_MODULES)
    dag_ids = []
    for path in SNIPPET_DAG_FILES:
        found = parsed[str(path)]
        assert found["errors"] == {}, path.name
        assert found["dags"], f"{path.name} defines no DAG"
        assert found["warnings"] == [], path.name
        assert found["heavy"] == [], f"{path.name} (or a file before it) imports {found['heavy']}"
        dag_ids += found["dags"]
    assert len(dag_ids) == len(set(dag_ids)), dag_ids


@pytest.fixture
def my_pkg(monkeypatch):
    """docs/snippets/my_pkg, importable as the example DAGs name it (``my_pkg.models:Predictor``)."""
    monkeypatch.syspath_prepend(str(SNIPPETS))
    for name in [m for m in sys.modules if m == "my_pkg" or m.startswith("my_pkg.")]:
        monkeypatch.delitem(sys.modules, name)
    import my_pkg

    return my_pkg


def run_stage(predictor: str, kwargs: dict, table: pa.Table) -> pa.Table:
    """What one replica of a stage makes of a block: the provider's own StageWorker, without Ray."""
    from airflow_provider_raybatch.pipeline.config import Stage
    from airflow_provider_raybatch.pipeline.execution.stages import StageWorker

    return pa.concat_tables(StageWorker(Stage(predictor, kwargs))(table))


def features_table(rows: int, width: int = 4) -> pa.Table:
    values = pa.array(np.arange(rows * width, dtype=np.float32))
    return pa.table({"id": pa.array(range(rows)), "features": pa.FixedSizeListArray.from_arrays(values, width)})


def test_the_example_predictors_score_a_block_as_a_stage_does(my_pkg, tmp_path):
    weights, projection = tmp_path / "weights.npy", tmp_path / "embedder.npy"
    np.save(weights, np.eye(4, 3, dtype=np.float32))
    np.save(projection, np.ones((4, 8), dtype=np.float32))
    table = features_table(6)

    scored = run_stage("my_pkg.models:Predictor", {"model_path": str(weights)}, table)
    assert scored.column_names == ["label", "score"] and scored.num_rows == 6
    assert scored.column("label").to_pylist() == [2] * 6  # the third feature is the largest of the three

    # The chain of docs/snippets/chains.py: normalize, then the embedder, each on what the last returned.
    normalized = run_stage("my_pkg.pre:normalize", {"column": "features"}, table)
    norms = np.linalg.norm(normalized.column("features").combine_chunks().flatten().to_numpy().reshape(6, 4), axis=1)
    assert np.allclose(norms[1:], 1.0)  # row 0 is all zeros: left at zero, not divided by it
    embedded = run_stage("my_pkg.models:Embedder", {"model_path": str(projection)}, normalized)
    assert embedded.column_names == ["embedding"] and embedded.schema.field("embedding").type.list_size == 8

    # Rejected rows carry their reason and kind; the others none.
    checked = run_stage("my_pkg.models:score_or_reject", {"limit": 20.0}, table)
    reasons = checked.column("__raybatch_reject").to_pylist()
    assert reasons[0] is None and reasons[1:] == ["feature sum beyond 20.0"] * 5
    assert checked.column("__raybatch_reject_kind").to_pylist() == [None] + ["engine_error"] * 5


FENCE = re.compile(r"^```(\S*)\n(.*?)^```", re.DOTALL | re.MULTILINE)


def appears_in(block: str, text: str) -> bool:
    """Each paragraph of ``block`` appears in ``text`` in order, verbatim but for a uniform indent
    (a task inside ``with DAG(...)`` is indented where the README shows it at the left margin)."""
    position = 0
    for paragraph in re.split(r"\n\s*\n", block.strip("\n")):
        found = [text.find(textwrap.indent(paragraph, " " * n), position) for n in range(0, 13, 4)]
        found = [i for i in found if i >= 0]
        if not found:
            return False
        position = min(found) + 1
    return True


def test_every_python_block_of_the_readme_is_a_copy_of_a_tested_file():
    readme = (REPO / "README.md").read_text()
    blocks = [body for lang, body in FENCE.findall(readme) if lang in ("python", "py")]
    assert blocks, "the README shows at least one operator example"
    sources = {p: p.read_text() for p in [*sorted((REPO / "dags").glob("*.py")), *SNIPPET_DAG_FILES]}
    for block in blocks:
        homes = [p.name for p, text in sources.items() if appears_in(block, text)]
        assert homes, f"README block not found verbatim in dags/ or docs/snippets/:\n{block}"


def test_the_readme_links_to_files_that_exist():
    readme = (REPO / "README.md").read_text()
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", readme) if "://" not in t]
    assert "docs/quickstart.md" in targets
    assert [t for t in targets if t and not (REPO / t).exists()] == []


def test_pages_include_their_code_from_tested_files_instead_of_typing_it():
    pages = sorted(DOCS.rglob("*.md"))
    typed, foreign = [], []
    for page in pages:
        text = page.read_text()
        for lang, _ in FENCE.findall(text):
            code = lang.lower() in ("python", "py", "python3", "pycon") or lang.startswith(("{code", "{eval"))
            autodoc = lang == "{eval-rst}" and page.name == "api.md"  # directives only, no code
            if code and not autodoc:
                typed.append(f"{page.relative_to(DOCS)}: {lang}")
        for target in re.findall(r"^```\{literalinclude\} (\S+)", text, re.MULTILINE):
            source = (page.parent / target).resolve()
            if not source.is_file() or not any(source.is_relative_to(root) for root in TESTED_SOURCES):
                foreign.append(f"{page.relative_to(DOCS)}: {target}")
    assert typed == []
    assert foreign == []
