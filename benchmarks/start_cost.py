"""Start-up at scale: seconds from task start to the first new range, with many input files and
many committed ranges, before vs after the scale-out ledger.

The input is ``--files`` small Parquet files (``--rows`` rows each, one row group) cut into one
range per row, so ``F`` files make ``10 F`` ranges; subsets of them (globs over the file names)
give inputs of 10^k files. For each input size and each version of the provider (this checkout,
and ``--before``: one record object per range, a plan listing every range), two real operator
runs (embedded Ray, light model), each killed as soon as its first range file appears:

- ``fresh``: an empty output. Planning (listing, every footer), recording the plan, building
  the dataset, starting Ray, then the first range.
- ``resume``: the same output with every range committed but the last file's 10, committed as
  each version records them (before: a record file per range; after: the manifest a failed run
  folds its segments into). What a retry pays before its first new range, as the number of
  committed ranges grows while the work left stays the same.

Also the planner alone over all the files (``planning_cost.py``'s measure) in seconds per file.

    python -m benchmarks.start_cost                          # 100,000 files: up to 1M ranges
    python -m benchmarks.start_cost --files 1000 --s3        # output on a moto S3 server
"""

from __future__ import annotations

import math
import shutil
import time
from pathlib import Path
from typing import Any

from airflow_provider_raybatch.pipeline.commit.ledger import OutputLedger
from airflow_provider_raybatch.pipeline.store.files import resolve
from benchmarks.ledger_cost import BUCKET, write_layout_1, write_manifest
from benchmarks.planning_cost import make_files, planner
from benchmarks.support.cli import base_parser
from benchmarks.support.data import moto_s3, weights
from benchmarks.support.history import BEFORE_SCALE_OUT, provider_at
from benchmarks.support.paths import REPO
from benchmarks.support.results import Results
from benchmarks.support.runs import VariantRun
from benchmarks.support.stats import ratio

FILE_DIGITS = 6  # part-000000.parquet: subsets of 10^k files are the globs part-0...0*.parquet
LEFT = 10  # ranges left to do in a resume: the last file's


def subset(folder: Path, files: int) -> str:
    """A glob over the first ``files`` (a power of ten) input files."""
    digits = round(math.log10(files))
    return str(folder / f"part-{'0' * (FILE_DIGITS - digits)}*.parquet")


def first_range_s(
    params: dict[str, Any], output: str, fs: Any, env: dict[str, str] | None, until_plan: bool = False
) -> float:
    """Run the operator until its first range file is published (or its plan recorded), kill it, return the seconds."""

    def reached() -> bool:
        if until_plan:
            return fs.exists(f"{output}/_raybatch/plan.json")
        return any(Path(p).name.startswith("part-") for p in listing(fs, output))

    run = VariantRun("operator", params, env=env)
    started_at = None
    try:
        while True:
            if run.process.poll() is not None:
                raise RuntimeError(f"the run ended before its first range: {run.log_path.read_text()[-3000:]}")
            if started_at is None:
                for line in run.log_path.read_text().splitlines():
                    if line.startswith("STARTED "):
                        started_at = float(line.split()[1])
            elif reached():
                return time.time() - started_at
            time.sleep(0.05)
    finally:
        run.kill()
        run.finish()


def listing(fs: Any, folder: str) -> list[str]:
    try:
        return fs.ls(folder, detail=False, refresh=True)  # s3fs caches listings otherwise
    except FileNotFoundError:
        return []


def commit_all_but_last(url: str, options: dict[str, Any] | None, version: str) -> None:
    """Leave the output as a run that committed every range but the last ``LEFT`` of its recorded plan left it."""
    ids = OutputLedger.open(url, options).load_plan().range_ids()
    fs, root = resolve(url, options)
    for entry in listing(fs, root):
        if Path(entry).name.startswith("part-"):
            fs.rm(entry)
    for name in ("commits", "segments", "manifest.json"):
        if fs.exists(f"{root}/_raybatch/{name}"):
            fs.rm(f"{root}/_raybatch/{name}", recursive=True)
    (write_layout_1 if version == "before" else write_manifest)(url, options, ids[:-LEFT])


def main(argv: list[str] | None = None) -> Results:
    parser = base_parser(__doc__.splitlines()[0], rows=[10])
    parser.add_argument("--files", type=int, default=100_000, help="input files (a power of ten)")
    parser.add_argument("--smallest", type=int, default=1_000, help="the smallest subset of files measured")
    parser.add_argument("--before", default=BEFORE_SCALE_OUT, help="git commit to compare with (default: %(default)s)")
    parser.add_argument("--s3", action="store_true", help="outputs on a moto S3 server (input stays local)")
    parser.add_argument(
        "--fresh-max-ranges",
        type=int,
        default=100_000,
        help="above this, a fresh run is stopped once its plan is recorded (one read task per range: see RESULTS.md)",
    )
    args = parser.parse_args(argv)
    rows = args.rows[0]
    name = "start_cost_s3" if args.s3 else "start_cost"
    results = Results(name, f"Start-up at scale ({'moto S3' if args.s3 else 'local'} output): before vs after", args)
    folder = args.work_dir / f"planning-{args.files}x{rows}"
    make_files(folder, args.files, rows)

    started = time.perf_counter()
    planned = planner(folder)
    planning_s = time.perf_counter() - started
    assert planned == args.files * rows, planned
    results.check(
        f"planning {args.files:,} files (the planner alone), ms per file",
        round(planning_s / args.files * 1e3, 3),
        "-",
        None,
    )

    options, server = moto_s3(BUCKET) if args.s3 else (None, None)
    env = None
    if server is not None:  # the task, its Ray workers and the setup here reach the same server
        endpoint = options["client_kwargs"]["endpoint_url"]
        env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_ENDPOINT_URL": endpoint}
        env["AWS_DEFAULT_REGION"] = "us-east-1"
    sizes = [10**k for k in range(round(math.log10(args.smallest)), round(math.log10(args.files)) + 1)]
    try:
        with provider_at(args.before) as before_package:
            for files in sizes:
                ranges = files * rows
                seconds: dict[tuple[str, str], float] = {}
                for version, package_root in (("before", before_package), ("after", str(REPO))):
                    output = f"s3://{BUCKET}/{version}-{files}" if args.s3 else str(args.work_dir / f"start-{version}")
                    fs, root = resolve(output, options)
                    if fs.exists(root):
                        fs.rm(root, recursive=True)
                    params = {
                        "input": subset(folder, files),
                        "output": output,
                        "model": "light",
                        "weights": str(weights(args.work_dir, "light")),
                        # One range per model call: a block of many ranges would be written as one
                        # file per range by one task, holding back the first range with the rest.
                        "batch_size": 1,
                        "threads": 1,
                        "rows_per_range": 1,
                        "package_root": package_root,
                        "fresh_output": False,
                    }
                    until_plan = ranges > args.fresh_max_ranges
                    fresh = "fresh, to its plan" if until_plan else "fresh"
                    seconds[fresh, version] = first_range_s(params, root, fs, env, until_plan)
                    commit_all_but_last(output, options, version)
                    seconds["resume", version] = first_range_s(params, root, fs, env)
                    for case in (fresh, "resume"):
                        results.add(
                            files=files,
                            ranges=ranges,
                            case=case,
                            committed=ranges - LEFT if case == "resume" else 0,
                            version=version,
                            seconds=round(seconds[case, version], 2),
                        )
                    fs.rm(root, recursive=True)
                for case in (fresh, "resume"):
                    results.check(
                        f"{ranges:,} ranges, {case}: first range, before / after (x faster)",
                        ratio(seconds[case, "before"], seconds[case, "after"]),
                        "(report)",
                        None,
                    )
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(args.work_dir / "start-before", ignore_errors=True)
        shutil.rmtree(args.work_dir / "start-after", ignore_errors=True)
    results.note(
        "first_range_s: from the start of the operator's execute() to the first range file published "
        "(embedded Ray: it includes starting Ray, ~5 s here); 'fresh, to its plan': to the plan recorded, for "
        "inputs whose fresh run makes more read tasks (one per range) than Ray Data starts in reasonable time. 'resume': all ranges but the last 10 committed "
        "as each version records them; before: a record file per range and a plan listing every range; after: "
        "a manifest and a plan of files and row groups. Setup writes (not measured) skip fsync."
    )
    results.write()
    return results


if __name__ == "__main__":
    main()
