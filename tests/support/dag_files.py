"""DAG files parsed as a DAG processor parses them: in a fresh interpreter, with the modules they
imported (to catch heavy imports on the parsing path) and the time it took."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tests.conftest import REPO

_PARSE_SCRIPT = """
import json, sys, time, warnings
started = time.perf_counter()
from tests.support.airflow_versions import DagBag
heavy = set(sys.argv[2].split(","))
results = {}
for path in json.loads(sys.argv[1]):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bag = DagBag(dag_folder=path)
    results[path] = {
        "errors": {k: str(v)[-2000:] for k, v in bag.import_errors.items()},
        "dags": sorted(bag.dags),
        "warnings": [str(w.message) for w in caught],
        # Modules stay loaded: what a file imports shows from that file on.
        "heavy": sorted({m.split(".")[0] for m in sys.modules} & heavy),
        "seconds": round(time.perf_counter() - started, 2),
    }
print(json.dumps(results))
"""


def parse_dag_files(paths: Iterable[Path], heavy_modules: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Path -> its ``errors``, ``dags``, ``warnings``, the ``heavy`` modules loaded once it was
    parsed, and ``seconds`` since the interpreter started (Airflow's own imports included)."""
    result = subprocess.run(
        [sys.executable, "-c", _PARSE_SCRIPT, json.dumps([str(p) for p in paths]), ",".join(heavy_modules)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])
