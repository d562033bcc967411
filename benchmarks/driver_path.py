"""Driver path: what the task's driver receives and holds, before vs after range files moved to the workers.

The same operator run, on this checkout and on an earlier commit of it (``--before``, default:
the last commit whose driver wrote every range file), with a light model (MLP 32-64-10) and a
wide output (32-64-256: 256 float32 per row), embedded Ray. For each: the bytes of the blocks
the driver took from Ray Data (counted around ``Dataset.iter_batches`` in the child process),
the output's bytes on disk, the driver process's peak RSS, and wall time. The earlier commit is
checked out into a temporary git worktree; its package is imported in place of this one.

    python benchmarks/driver_path.py                   # 1M rows
    python benchmarks/driver_path.py --rows 200000     # quick
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import REPO, Results, base_parser, common_params, make_input, ratio, run_variant

#: The last commit whose driver received every row and wrote every range file.
BEFORE = "b0ef868"
MODELS = ["light", "wide"]
DRIVER_BYTES_TARGET = 0.01  # the driver receives metadata only: under 1 % of the output's bytes


def main(argv: list[str] | None = None) -> Results:
    parser = base_parser(__doc__.splitlines()[0], rows=[1_000_000])
    parser.add_argument("--before", default=BEFORE, help="git commit to compare with (default: %(default)s)")
    parser.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    args = parser.parse_args(argv)
    results = Results("driver_path", "Driver path: rows through the driver (before) vs metadata only (after)", args)

    with tempfile.TemporaryDirectory(prefix="rbb-before-") as tmp:
        before_tree, before_package = Path(tmp) / "tree", Path(tmp) / "package"
        subprocess.run(["git", "worktree", "add", "--detach", before_tree, args.before], cwd=REPO, check=True)
        # Only the provider comes from the earlier commit; the benchmark's own code stays this one's.
        before_package.mkdir()
        (before_package / "airflow_provider_raybatch").symlink_to(before_tree / "airflow_provider_raybatch")
        try:
            for rows in args.rows:
                input_path = make_input(args.work_dir, rows)
                for model in args.models:
                    runs = {}
                    for version, package_root in (("before", str(before_package)), ("after", str(REPO))):
                        output = args.work_dir / f"out-driver-path-{version}"
                        params = {**common_params(args, input_path, output, model), "package_root": package_root}
                        params["count_driver_bytes"] = True
                        result = run_variant("operator", params)
                        output_bytes = sum(f.stat().st_size for f in output.rglob("part-*.parquet"))
                        runs[version] = result
                        results.add(
                            rows=rows,
                            model=model,
                            version=version,
                            wall_s=result["wall_s"],
                            rows_per_s=round(rows / result["wall_s"]),
                            driver_bytes=result["driver_bytes"],
                            output_bytes=output_bytes,
                            driver_share=round(result["driver_bytes"] / output_bytes, 5),
                            driver_peak_rss_mb=result["driver_peak_rss_mb"],
                            load_avg=result["load_avg"],
                        )
                    share = results.rows[-1]["driver_share"]
                    results.check(
                        f"{rows:,} rows, {model}: driver bytes / output bytes (after)",
                        share,
                        f"< {DRIVER_BYTES_TARGET}",
                        share < DRIVER_BYTES_TARGET,
                    )
                    results.check(
                        f"{rows:,} rows, {model}: rows/s after / before",
                        ratio(runs["before"]["wall_s"], runs["after"]["wall_s"]),
                        "(none)",
                        None,
                    )
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", before_tree], cwd=REPO, check=False)
    results.write()
    return results


if __name__ == "__main__":
    main()
