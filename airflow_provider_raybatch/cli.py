"""The ``raybatch`` command line (also ``python -m airflow_provider_raybatch``): an output's status,
its rejects, and the verifier.

::

    raybatch status OUTPUT            progress, rate, time left, lease holder, rejects, state
    raybatch rejects OUTPUT           a sample of the rejected rows (--limit), or all of them (--export)
    raybatch verify OUTPUT            check a finished output against its ledger (exit 1 on faults)

A table output: ``OUTPUT`` is the Delta table's root or the Iceberg table's location, with
``--format delta|iceberg --table-partition COLUMN=VALUE`` (``verify`` of an Iceberg table also takes
``--table ns.table`` and ``--catalog KEY=VALUE`` properties, else pyiceberg's own configuration of
the catalog named ``raybatch``).

Remote outputs are read with the environment's credentials (for ``s3://``: the AWS variables or
profile, as s3fs reads them), or with an Airflow connection's (``--aws-conn-id``, ``--gcp-conn-id``,
``--azure-conn-id``: resolved as the operators resolve them, which needs Airflow's configuration).
Credentials are never printed. ``--json`` prints one JSON document on stdout instead of text.

Exit status: 0 done (``verify``: no fault), 1 faults found by ``verify``, 2 a usage error or a path
that holds no output of this provider.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from airflow_provider_raybatch.pipeline.config import DEFAULT_LEASE_TIMEOUT_S
from airflow_provider_raybatch.pipeline.errors import RayBatchError
from airflow_provider_raybatch.pipeline.output_ref import OutputRef

#: Files a verify reads before it draws a progress bar (a short one finishes before a bar helps).
PROGRESS_MIN_FILES = 20
BAR_WIDTH = 30
USAGE_ERROR = 2


def main(argv: list[str] | None = None, prog: str = "raybatch") -> int:
    """Run one command; return the exit status.

    :param argv: the arguments (default: the process's).
    :param prog: the program's name in usage and error messages.
    """
    parser = _parser(prog)
    args = parser.parse_args(argv)
    partition = _pairs(parser, args.table_partition, "--table-partition")
    if args.format != "parquet" and not partition:
        parser.error("--table-partition COLUMN=VALUE is needed for a table")
    catalog = _pairs(parser, getattr(args, "catalog", []), "--catalog")
    try:
        output = _output(args, partition if args.format != "parquet" else {}, catalog)
        if args.command == "status":
            return _status(args, output)
        if args.command == "rejects":
            return _rejects(parser, args, output)
        return _verify(args, output)
    except RayBatchError as e:  # a path without an output, a connection that does not resolve
        print(f"{prog}: error: {e}", file=sys.stderr)
        return USAGE_ERROR


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("output_path", help="the output folder, local or a URL such as s3://bucket/out/2026-11-20")
    common.add_argument("--format", choices=("parquet", "delta", "iceberg"), default="parquet")
    # --partition: the flag's name before shards were told apart from a table's partitions.
    common.add_argument(
        "--table-partition",
        "--partition",
        dest="table_partition",
        action="append",
        default=[],
        metavar="COLUMN=VALUE",
        help="a table's partition (the operator's table_partition); --partition is an alias",
    )
    common.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    for store in ("aws", "gcp", "azure"):
        common.add_argument(
            f"--{store}-conn-id", metavar="CONN_ID", help=f"read with this Airflow connection's {store} credentials"
        )

    status = commands.add_parser("status", parents=[common], help="where an output stands (bookkeeping only)")
    status.add_argument(
        "--lease-timeout",
        type=float,
        default=DEFAULT_LEASE_TIMEOUT_S,
        metavar="SECONDS",
        help="for leases taken by an older release (which did not record their lease_timeout): a holder "
        "silent for longer is not running (default %(default)g)",
    )
    rejects = commands.add_parser("rejects", parents=[common], help="print or export the rejected rows")
    rejects.add_argument("--limit", type=int, default=20, metavar="N", help="rows to print (default %(default)s)")
    rejects.add_argument("--export", metavar="PATH", help="write every rejected row to PATH (.parquet or .csv)")
    verify = commands.add_parser("verify", parents=[common], help="check a finished output against its ledger")
    verify.add_argument("--table", help="the Iceberg table, namespace.table")
    verify.add_argument(
        "--catalog", action="append", default=[], metavar="KEY=VALUE", help="an Iceberg catalog property"
    )
    return parser


def _output(args: argparse.Namespace, partition: dict[str, str], catalog: dict[str, str]) -> OutputRef:
    """The output the flags name, with the connections' credentials (none named: the environment's).

    The hooks import Airflow only when a connection is named: it needs its configuration then.
    """
    # Airflow logs to stdout as it reads a connection: to stderr here, so that stdout stays the
    # result (one JSON document with --json). At the descriptor, as its loggers hold their stream.
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        from airflow_provider_raybatch.hooks.output_refs import resolve_output

        return resolve_output(
            args.output_path,
            args.format,
            partition,
            getattr(args, "table", None),
            catalog,
            aws_conn_id=args.aws_conn_id,
            gcp_conn_id=args.gcp_conn_id,
            azure_conn_id=args.azure_conn_id,
        )
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


# --- status ----------------------------------------------------------------------------------


def _status(args: argparse.Namespace, output: OutputRef) -> int:
    from airflow_provider_raybatch.pipeline.status import read_output

    writers = read_output(output, lease_timeout_s=args.lease_timeout)
    if not output.is_table:
        if args.json:
            _print_json(writers[0].to_dict())
        else:
            print(describe_status(writers[0]))
        return 0
    if args.json:
        _print_json({"table": output.path, "partition": output.partition, "writers": [w.to_dict() for w in writers]})
    else:
        print("\n\n".join(f"writer {w.writer}, generation {w.generation}\n{describe_status(w)}" for w in writers))
    return 0


def describe_status(status: Any) -> str:
    """A few lines for a person: a bar, rows, commit rates and time left, rejects, the last writer,
    lease holders, state.

    :param status: an :class:`~airflow_provider_raybatch.pipeline.status.OutputStatus`.
    """
    state = {"partial": "partial (stopped part-way)"}.get(status.state, status.state)
    lines = [
        f"{status.path}: {state}",
        f"{_bar(status.fraction_done)} {status.fraction_done:6.1%}  "
        f"ranges {status.ranges_committed:,}/{status.ranges_planned:,}, rows {status.rows_done:,}/{status.rows_planned:,}",
    ]
    if status.rows_rejected:
        lines.append(
            f"rejected {status.rows_rejected:,} rows ({status.engine_errors:,} engine errors, "
            f"{status.rows_rejected - status.engine_errors:,} invalid input)"
        )
    if status.tokens_in is not None:
        lines.append(f"tokens {status.tokens_in:,} in, {status.tokens_out:,} out (committed rows)")
    if status.truncated_rows is not None:
        lines.append(f"{status.truncated_rows:,} rows truncated to the model's maximum length (committed rows)")
    if status.commit_rows_per_s is not None:
        left = f", about {_duration(status.eta_s)} left" if status.eta_s is not None else ""
        lines.append(f"commit rate {status.commit_rows_per_s:,.0f} rows/s (current){left}")
    if status.average_commit_rows_per_s is not None:
        lines.append(
            f"commit rate {status.average_commit_rows_per_s:,.0f} rows/s (average, gaps between tries not counted)"
        )
    if status.last_writer is not None:
        lines.append(f"last writer: {status.last_writer['describe']}")
    if status.last_commit_at is not None:
        lines.append(f"last commit {_duration(max(0.0, status.read_at - status.last_commit_at))} ago")
    if status.table_commits is not None:
        lines.append(
            f"table commits {status.table_commits}, adding {status.ranges_in_table_commits:,} of "
            f"{status.ranges_planned:,} ranges"
        )
    if status.lease is not None:
        lines.append(f"lease: {_lease_line(status.lease)}")
    for shard in status.shards:
        lease = f"; {_lease_line(shard.lease)}" if shard.lease else ""
        name = f"shard {shard.index} ({shard.key})" if shard.index is not None else f"shard {shard.key}"
        of = f" of {shard.ranges_planned:,}" if shard.ranges_planned is not None else ""
        rows_of = f" of {shard.rows_planned:,}" if shard.rows_planned is not None else ""
        lines.append(
            f"{name}: {shard.ranges_committed:,}{of} ranges, {shard.rows_committed:,}{rows_of} rows committed{lease}"
        )
    return "\n".join(lines)


def _lease_line(lease: Any) -> str:
    if lease.released:
        how = "released"
    elif lease.holder_gone:
        how = "not released, its process has ended"
    elif lease.live:
        how = "held"
    else:
        how = "not released, heartbeat stale"
    return f"{lease.holder}; {how}; heartbeat {_duration(lease.heartbeat_age_s)} ago"


def _bar(fraction: float, width: int = BAR_WIDTH) -> str:
    filled = min(width, int(fraction * width))
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


# --- rejects ---------------------------------------------------------------------------------


def _rejects(parser: argparse.ArgumentParser, args: argparse.Namespace, output: OutputRef) -> int:
    import pyarrow as pa

    from airflow_provider_raybatch.pipeline.status import read_output_rejects

    export = Path(args.export) if args.export else None
    if export is not None and export.suffix.lower() not in (".parquet", ".csv"):
        parser.error(f"--export writes .parquet or .csv, not {export.name!r}")
    if args.limit < 0:
        parser.error("--limit takes a number >= 0")
    samples = read_output_rejects(output, None if export is not None else args.limit)
    rows = [s.rows for s in samples if s.rows.num_columns]
    table = pa.concat_tables(rows, promote_options="permissive") if rows else pa.table({})
    rejected = sum(s.rejected for s in samples)
    engine_errors = sum(s.engine_errors for s in samples)
    if export is not None:
        _export(table, export)
    if args.json:
        document = {
            "path": args.output_path,
            "rejected": rejected,
            "engine_errors": engine_errors,
            "invalid_input": rejected - engine_errors,
            "rows": [r for s in samples for r in s.to_dict()["rows"]][: args.limit],
        }
        if export is not None:
            document["exported"] = {"path": str(export), "rows": table.num_rows}
        _print_json(document)
        return 0
    print(
        f"{args.output_path}: {rejected:,} rejected rows ({engine_errors:,} engine errors, {rejected - engine_errors:,} invalid input)"
    )
    if export is not None:
        print(f"wrote {table.num_rows:,} rows to {export}")
    elif table.num_rows:
        print(_rows_text(table.slice(0, args.limit)))
        if rejected > table.num_rows:
            print(f"... {rejected - table.num_rows:,} more (--limit N, or --export PATH for all)")
    return 0


def _export(table: Any, path: Path) -> None:
    import pyarrow.csv as csv
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".csv":
        csv.write_csv(_flat(table), str(path))
    else:
        pq.write_table(table, str(path))


def _flat(table: Any) -> Any:
    """``table`` with its nested columns (lists, structs: CSV has no such cells) as JSON text."""
    import pyarrow as pa

    for i, column in enumerate(table.schema):
        if pa.types.is_nested(column.type):
            text = [None if v is None else json.dumps(v, default=str) for v in table.column(i).to_pylist()]
            table = table.set_column(i, column.name, pa.array(text, pa.string()))
    return table


def _rows_text(table: Any, width: int = 60) -> str:
    """The rows as aligned columns, ``reason`` last (the longest), values cut at ``width``."""
    names = [n for n in table.column_names if n not in ("reason", "kind")] + [
        n for n in ("kind", "reason") if n in table.column_names
    ]
    # Other columns than the reason are cut shorter: a row's features would fill the line.
    cells = [[_cell(v, width if n == "reason" else 24) for v in table.column(n).to_pylist()] for n in names]
    widths = [max([len(n)] + [len(c) for c in column]) for n, column in zip(names, cells, strict=True)]
    lines = ["  ".join(n.ljust(w) for n, w in zip(names, widths, strict=True)).rstrip()]
    for i in range(table.num_rows):
        lines.append("  ".join(column[i].ljust(w) for column, w in zip(cells, widths, strict=True)).rstrip())
    return "\n".join(lines)


def _cell(value: Any, width: int) -> str:
    text = value.hex() if isinstance(value, bytes) else str(value)
    text = text.replace("\n", " ")
    return text if len(text) <= width else text[: width - 3] + "..."


# --- verify ----------------------------------------------------------------------------------


def _verify(args: argparse.Namespace, output: OutputRef) -> int:
    from airflow_provider_raybatch.pipeline.status import read_output, verify

    # A path without an output is a usage error (exit 2, as for status and rejects), not a fault of
    # an output: found as status finds it, which raises OutputNotFoundError naming the path.
    read_output(output)
    bar = ProgressBar(sys.stderr) if sys.stderr.isatty() and not args.json else None
    warnings: list[str] = []  # worth knowing, but no fault: the exit status ignores them
    try:
        faults = verify(output, bar, warnings)
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        _print_json({"path": args.output_path, "ok": not faults, "faults": faults, "warnings": warnings})
    else:
        for fault in faults:
            print(f"FAULT {fault}")
        if not faults:
            what = (
                f"partition {output.partition}: every range in the table's current snapshot once, row keys unique"
                if output.is_table
                else "every planned range committed, every file as recorded, row keys unique"
            )
            print(f"OK {args.output_path}: {what}")
        for warning in warnings:
            print(f"WARNING {warning}")
    return 1 if faults else 0


class ProgressBar:
    """A one-line bar of files read, redrawn in place on a terminal (at most 10 times a second);
    drawn only once a verify has :data:`PROGRESS_MIN_FILES` files to read.

    :param stream: the terminal (stderr: stdout stays the result, for a pipe).
    """

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.drawn = 0.0
        self.shown = False

    def __call__(self, done: int, total: int) -> None:
        if total < PROGRESS_MIN_FILES:
            return
        now = time.monotonic()
        if done < total and now - self.drawn < 0.1:
            return
        self.drawn, self.shown = now, True
        self.stream.write(f"\rverify {_bar(done / total)} {done:,}/{total:,} files")
        self.stream.flush()

    def close(self) -> None:
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()


def _pairs(parser: argparse.ArgumentParser, items: list[str], option: str) -> dict[str, str]:
    pairs = dict(item.split("=", 1) for item in items if "=" in item)
    if len(pairs) != len(items):
        parser.error(f"{option} takes KEY=VALUE, got {items}")
    return pairs


def _print_json(document: dict[str, Any]) -> None:
    print(json.dumps(document, indent=1, default=str))


def run() -> None:
    """The console script ``raybatch``."""
    from airflow_provider_raybatch.pipeline.runtime.exit import exit_now

    exit_now(main())
