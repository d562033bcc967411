"""Driver path: what the task's driver receives and holds, before vs after range files moved to the workers.

The same operator run, on this checkout and on an earlier commit of it (``--before``, default:
the last commit whose driver wrote every range file), with a light model (MLP 32-64-10) and a
wide output (32-64-256: 256 float32 per row), embedded Ray. For each: the bytes of the blocks
the driver took from Ray Data (counted around ``Dataset.iter_batches`` in the child process),
the output's bytes on disk, the driver process's peak RSS, and wall time. The earlier commit is
checked out into a temporary git worktree; its package is imported in place of this one.

    python -m benchmarks.driver_path                   # 1M rows
    python -m benchmarks.driver_path --rows 200000     # quick
"""

from __future__ import annotations

import contextlib
import itertools

from benchmarks.scale import CLUSTER_ENV, NODE_CPUS, LocalCluster
from benchmarks.support.cli import base_parser, common_params
from benchmarks.support.data import make_input
from benchmarks.support.history import BEFORE_SCALE_OUT, provider_at
from benchmarks.support.paths import REPO
from benchmarks.support.results import Results
from benchmarks.support.runs import run_variant
from benchmarks.support.stats import ratio

MODELS = ["light", "wide"]
DRIVER_BYTES_TARGET = 0.01  # the driver receives metadata only: under 1 % of the output's bytes


def main(argv: list[str] | None = None) -> Results:
    parser = base_parser(__doc__.splitlines()[0], rows=[1_000_000])
    parser.add_argument("--before", default=BEFORE_SCALE_OUT, help="git commit to compare with (default: %(default)s)")
    parser.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    parser.add_argument("--cluster", action="store_true", help="also on a 2-node local Ray cluster (scale.py's)")
    args = parser.parse_args(argv)
    results = Results("driver_path", "Driver path: rows through the driver (before) vs metadata only (after)", args)

    with contextlib.ExitStack() as stack:
        before_package = stack.enter_context(provider_at(args.before))
        places: dict[str, str | None] = {"embedded": None}
        if args.cluster:
            cluster = LocalCluster()
            stack.callback(cluster.stop)
            places[f"2 nodes ({NODE_CPUS} + {NODE_CPUS} CPUs, one machine)"] = cluster.address
        for rows, model, (where, address) in itertools.product(args.rows, args.models, places.items()):
            input_path = make_input(args.work_dir, rows)
            runs = {}
            for version, package_root in (("before", before_package), ("after", str(REPO))):
                output = args.work_dir / f"out-driver-path-{version}"
                params = {**common_params(args, input_path, output, model), "package_root": package_root}
                params.update(count_driver_bytes=True, ray_address=address)
                result = run_variant("operator", params, env=CLUSTER_ENV if address else None)
                output_bytes = sum(f.stat().st_size for f in output.rglob("part-*.parquet"))
                runs[version] = result
                results.add(
                    rows=rows,
                    model=model,
                    ray=where,
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
                f"{rows:,} rows, {model}, {where}: driver bytes / output bytes (after)",
                share,
                f"< {DRIVER_BYTES_TARGET}",
                share < DRIVER_BYTES_TARGET,
            )
            results.check(
                f"{rows:,} rows, {model}, {where}: rows/s after / before",
                ratio(runs["before"]["wall_s"], runs["after"]["wall_s"]),
                "(none)",
                None,
            )
    results.write()
    return results


if __name__ == "__main__":
    main()
