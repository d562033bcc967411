"""Run every benchmark in turn and gather their tables into ``<out>/all.md``.

python -m benchmarks.run_all            # full sizes: about 13 minutes on 2 quiet cores, 30 under load
python -m benchmarks.run_all --quick    # small sizes: checks that everything runs
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from benchmarks import checkpoint_cost, cold_start, commit_cost, fixed_cost, images, memory, resume, scale, throughput
from benchmarks.support.paths import DEFAULT_RESULTS_DIR, DEFAULT_WORK_DIR
from benchmarks.support.results import machine

BENCHMARKS = {
    "throughput": (throughput, ["--rows", "200000", "400000"]),
    "fixed_cost": (fixed_cost, ["--rows", "200000", "--repeats", "1"]),
    "cold_start": (cold_start, ["--repeats", "1"]),
    "resume": (resume, ["--rows", "400000"]),
    "checkpoint_cost": (checkpoint_cost, ["--rows", "400000", "--repeats", "1", "--finer"]),
    "commit_cost": (commit_cost, ["--ranges", "20", "--repeats", "1"]),
    "memory": (memory, ["--rows", "200000", "400000"]),
    "scale": (scale, ["--rows", "400000"]),
    "images": (images, ["--quick"]),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (each benchmark's own defaults otherwise)")
    parser.add_argument("--only", nargs="+", choices=list(BENCHMARKS), default=list(BENCHMARKS))
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS_DIR)
    parser.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR)
    args = parser.parse_args(argv)

    sections = []
    for name in args.only:
        module, quick_args = BENCHMARKS[name]
        print(f"== {name}", flush=True)
        started = time.monotonic()
        common = ["--out", str(args.out), "--work-dir", str(args.work_dir)]
        results = module.main(common + (quick_args if args.quick else []))
        path = args.out / f"{results.name}.md"
        print(f"== {name}: {time.monotonic() - started:.0f} s, {path}", flush=True)
        sections.append(path.read_text())
    m = machine()
    header = f"# Benchmark results\n\n{m['date']}, {m['nproc']} CPUs ({m['cpu_model']}), {m['ram_gib']} GiB RAM.\n"
    (args.out / "all.md").write_text(header + "\n" + "\n".join(sections))
    print(f"all results: {args.out / 'all.md'}")


if __name__ == "__main__":
    main()
