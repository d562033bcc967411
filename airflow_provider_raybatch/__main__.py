"""``python -m airflow_provider_raybatch verify <output_path>``: check a finished output (exit 1 on faults).

A table output: ``verify <table root or location> --format delta --partition ds=2026-11-24``
(Iceberg: ``--format iceberg --table ns.table``, its catalog from ``--catalog KEY=VALUE``
properties, else pyiceberg's own configuration of the catalog named ``raybatch``).

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
    verify.add_argument("--format", choices=("parquet", "delta", "iceberg"), default="parquet")
    verify.add_argument("--partition", action="append", default=[], metavar="COLUMN=VALUE", help="a table's partition")
    verify.add_argument("--table", help="the Iceberg table, namespace.table")
    verify.add_argument(
        "--catalog", action="append", default=[], metavar="KEY=VALUE", help="an Iceberg catalog property"
    )
    args = parser.parse_args(argv)

    if args.format == "parquet":
        from airflow_provider_raybatch.pipeline.commit.verify import verify_output

        faults = verify_output(args.output_path)
        what = "every planned range committed, every file as recorded, row keys unique"
    else:
        from airflow_provider_raybatch.pipeline.tables.verify import table_config, verify_table

        partition, catalog = _pairs(parser, args.partition, "--partition"), _pairs(parser, args.catalog, "--catalog")
        if not partition:
            parser.error("--partition COLUMN=VALUE is needed for a table")
        faults = verify_table(table_config(args.output_path, args.format, partition, args.table, catalog))
        what = f"partition {partition}: every range in the table's current snapshot once, row keys unique"
    for fault in faults:
        print(f"FAULT {fault}")
    if not faults:
        print(f"OK {args.output_path}: {what}")
    return 1 if faults else 0


def _pairs(parser: argparse.ArgumentParser, items: list[str], option: str) -> dict[str, str]:
    pairs = dict(item.split("=", 1) for item in items if "=" in item)
    if len(pairs) != len(items):
        parser.error(f"{option} takes KEY=VALUE, got {items}")
    return pairs


if __name__ == "__main__":
    from airflow_provider_raybatch.pipeline.runtime.exit import exit_now

    exit_now(main())
