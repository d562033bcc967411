"""``python -m airflow_provider_raybatch status|rejects|verify <output_path>``: the ``raybatch``
command line (:mod:`airflow_provider_raybatch.cli`), under the module's name.

``verify <output_path>`` checks a finished output (exit 1 on faults); a table output:
``verify <table root or location> --format delta --table-partition ds=2026-11-24`` (Iceberg:
``--format iceberg --table ns.table``, its catalog from ``--catalog KEY=VALUE`` properties, else
pyiceberg's own configuration of the catalog named ``raybatch``).
"""

from __future__ import annotations

from airflow_provider_raybatch import cli

PROG = "python -m airflow_provider_raybatch"


def main(argv: list[str] | None = None) -> int:
    """Run one command of :func:`.cli.main`; return the exit status."""
    return cli.main(argv, prog=PROG)


if __name__ == "__main__":
    from airflow_provider_raybatch.pipeline.runtime.exit import exit_now

    exit_now(main())
