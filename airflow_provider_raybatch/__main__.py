"""``python -m airflow_provider_raybatch verify <output_path>``: check a finished output (exit 1 on faults).

Remote outputs are read with the environment's credentials (for ``s3://``: the AWS variables or
profile, as s3fs reads them).
"""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m airflow_provider_raybatch", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    verify = commands.add_parser("verify", help="check a finished output against its ledger")
    verify.add_argument("output_path", help="the output folder, local or a URL such as s3://bucket/out/2026-11-20")
    args = parser.parse_args(argv)

    from airflow_provider_raybatch.pipeline.commit.verify import verify_output

    faults = verify_output(args.output_path)
    for fault in faults:
        print(f"FAULT {fault}")
    if not faults:
        print(f"OK {args.output_path}: every planned range committed, every file as recorded, row keys unique")
    return 1 if faults else 0


if __name__ == "__main__":
    from airflow_provider_raybatch.pipeline.runtime.exit import exit_now

    exit_now(main())
