"""The package's layering: no import cycle between its modules, and Airflow kept off the Ray side."""

from __future__ import annotations

import ast
import contextlib
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "airflow_provider_raybatch"
NAME = PACKAGE.name


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def parse(path: Path) -> ast.Module:
    """``ast.parse``, tried again on CPython 3.11's spurious "AST constructor recursion depth
    mismatch" SystemError (python/cpython#106905), seen when another thread of the test session
    builds an AST at the same moment."""
    text = path.read_text()
    for _ in range(2):
        with contextlib.suppress(SystemError):
            return ast.parse(text)
    return ast.parse(text)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that ``path`` imports anywhere: at the top, in functions, under TYPE_CHECKING.

    Lazy imports count too: they hide a cycle from the interpreter, not from a reader.
    """
    found = set()
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {n for n in names if n in modules}
    return found - {module_name(path)}


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    # A package's __init__ re-exporting its modules is not a dependency of those modules on it.
    return {module_name(p): {m for m in imports(p, modules) if not module_name(p).startswith(m + ".")} for p in paths}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_between_the_package_modules():
    graph = import_graph()
    assert f"{NAME}.pipeline.runner" in graph[f"{NAME}.pipeline.job"]  # the graph sees lazy imports
    assert find_cycle(graph) is None


@pytest.mark.parametrize("layer", ["pipeline", "llm"])
def test_code_that_runs_on_ray_imports_no_airflow_module_of_the_provider(layer):
    graph = import_graph()
    ray_side = [m for m in graph if m.startswith(f"{NAME}.{layer}")]
    airflow_side = (f"{NAME}.{p}" for p in ("operators", "hooks", "triggers", "links"))
    bad = {m: sorted(d for d in graph[m] if d.startswith(tuple(airflow_side))) for m in ray_side}
    assert {m: d for m, d in bad.items() if d} == {}


#: pipeline/'s layers, lowest first (see pipeline/STRUCTURE.md). A module may import its own layer
#: and the layers below it, never one above: stores know nothing of plans, planning and the local
#: Ray nothing of commits, the commit protocol nothing of Ray Data, and nothing below runs a task.
PIPELINE_LAYERS = [
    ("store", "errors", "columns", "ray_compat", "resources", "described", "config", "output_ref"),
    ("runtime", "planning"),
    ("commit", "tables", "status", "summary"),
    ("execution",),
    ("output_location", "prepare", "shards", "runner", "job"),
]


def pipeline_layer(module: str) -> int | None:
    prefix = f"{NAME}.pipeline."
    if not module.startswith(prefix):
        return None
    top = module[len(prefix) :].split(".")[0]
    return next(i for i, layer in enumerate(PIPELINE_LAYERS) if top in layer)


def test_every_pipeline_module_has_a_layer():
    graph = import_graph()
    unplaced = [m for m in graph if m.startswith(f"{NAME}.pipeline.") and pipeline_layer(m) is None]
    assert unplaced == []


def test_pipeline_layers_import_only_downwards():
    graph = import_graph()
    upward = {
        m: sorted(d for d in deps if (pipeline_layer(d) or 0) > layer)
        for m, deps in graph.items()
        if (layer := pipeline_layer(m)) is not None
    }
    assert {m: d for m, d in upward.items() if d} == {}


def test_the_local_ray_and_planning_know_nothing_of_each_other():
    runtime, planning = f"{NAME}.pipeline.runtime", f"{NAME}.pipeline.planning"
    crossing = [
        (m, d)
        for m, deps in import_graph().items()
        for d in deps
        if (m.startswith(runtime) and d.startswith(planning)) or (m.startswith(planning) and d.startswith(runtime))
    ]
    assert crossing == []


#: What Ray keeps private (no compatibility promised between releases).
PRIVATE_RAY = ("ray._", "ray.core.generated", "ray.data._internal")
#: The version-specific homes of Airflow names (airflow_provider_raybatch/version_compat.py).
MOVED_AIRFLOW = ("airflow.sdk.configuration", "airflow.sdk.exceptions", "airflow.configuration", "airflow.exceptions")


def imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_private_ray_and_moved_airflow_names_are_imported_only_by_the_compatibility_modules():
    """One place each for what differs between releases: pipeline/ray_compat.py and version_compat.py."""
    misplaced = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        for module in imported_modules(path):
            if module.startswith(PRIVATE_RAY) and name != f"{NAME}.pipeline.ray_compat":
                misplaced.setdefault(name, []).append(module)
            if module.startswith(MOVED_AIRFLOW) and name != f"{NAME}.version_compat":
                misplaced.setdefault(name, []).append(module)
    assert misplaced == {}


#: What the api-server must not import to serve the UI plugin.
HEAVY_MODULES = ("ray", "torch", "vllm", "transformers", "daft")

SERVE_AN_OUTPUT = """
import sys
from benchmarks.status import finish, write_output
from airflow_provider_raybatch.plugins import figures
from airflow_provider_raybatch.plugins.outputs import ResolvedOutput, TaskRef
writer = write_output(sys.argv[1], None, ranges=200, per_segment=30, done=120)
output = ResolvedOutput(TaskRef("d", "r", "t"), sys.argv[1], "parquet", None, None, "rendered", "running", 1, False)
document = figures.output_figures(output)
assert document["found"] and document["outputs"][0]["ranges_committed"] == 120, document
assert figures.verify(output)["unfinished"]  # a running output: no verdict yet
finish(*writer, ranges=200, per_segment=30)
assert figures.verify(output)["ok"] is False  # done, but its data files were never written
print(sorted(m for m in sys.modules if m.split(".")[0] in %r))
"""


def test_the_ui_plugin_imports_no_engine_to_load_or_to_serve(tmp_path):
    """plugins/ imports no engine, even lazily; and a process that loads the plugin, reads an
    output's figures and runs the verifier has imported none (its lazy imports included)."""
    direct = {
        module_name(path): sorted(m for m in imported_modules(path) if m.split(".")[0] in HEAVY_MODULES)
        for path in sorted((PACKAGE / "plugins").rglob("*.py"))
    }
    assert {m: i for m, i in direct.items() if i} == {}
    code = "import airflow_provider_raybatch.plugins.plugin\n" + SERVE_AN_OUTPUT % (HEAVY_MODULES,)
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=PACKAGE.parent,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"
