"""Table outputs exactly once when the object store fails the way stores do, write by write.

As ``tests/pipeline/test_store_faults.py`` does for the Parquet folder's protocol, for every
object a table output writes beyond it (the writer's lease and generation record, the table
commit intents, each format's own commit files): a real moto S3 server behind
:class:`tests.support.fault_proxy.FaultProxy`, reached by s3fs and by each table library
(delta-rs's object store; pyiceberg's file IO), each write applied but answered with an error or
with its reply lost. A "task" is a sequence of tries, as Airflow's retries make them; after the
try that succeeds, the table holds every input row once in its current snapshot, as the verifier
and a reader through the store directly (not the proxy) find it.
"""

from __future__ import annotations

import uuid

import pytest

from airflow_provider_raybatch.pipeline.errors import NotRetryableError
from airflow_provider_raybatch.pipeline.output_ref import OutputRef
from airflow_provider_raybatch.pipeline.runner import run_batch_inference
from airflow_provider_raybatch.pipeline.tables.verify import verify_table
from tests.pipeline.test_store_faults import BUCKET, store_options
from tests.support.data import assert_exactly_once, write_input
from tests.support.fault_proxy import FaultProxy
from tests.support.tables import IDENTIFIER, table_config

pytestmark = pytest.mark.usefixtures("ray_local")

ROWS = 100

#: Every object of a table output's own protocol, by the path of its requests (S3 REST), per format.
#: The staging output's files (data files, segments, manifest...) are the folder protocol's,
#: faulted one by one in test_store_faults.py.
WRITES = {
    "writer lease": ("PUT", r"/_raybatch/lease/"),
    "generation record": ("PUT", r"/_raybatch/generation\.json$"),
    "table commit intent": ("PUT", r"/_raybatch/table/\d+\.json$"),
}
FORMAT_WRITES = {
    # delta-rs commits by creating the log's next version with a conditional PUT.
    "delta": {"delta log version": ("PUT", r"/_delta_log/[^/]*\.json$")},
    # pyiceberg writes new metadata, a manifest list and manifests, then swaps the catalog's
    # pointer; pyarrow's S3 uploads each file in a multipart upload, applied by its completion.
    # (Faulted every time, these fail the try after its 20 commit attempts, each with pyarrow's
    # own retries: 85 s a case, for a try that ends as the others do; the first 3 are faulted.)
    "iceberg": {
        "iceberg metadata": ("POST", r"/metadata/[^/?]*\.metadata\.json\?uploadId="),
        "iceberg manifest": ("POST", r"/metadata/[^/?]*\.avro\?uploadId="),
    },
}
#: The writes common to both formats go through the same code whatever the format: faulted on Delta's
#: path only (CI's minutes); each format's own writes on its own.
CASES = [("delta", write) for write in [*WRITES, *FORMAT_WRITES["delta"]]]
CASES += [("iceberg", write) for write in FORMAT_WRITES["iceberg"]]


@pytest.fixture
def proxy(s3_server):
    with FaultProxy(s3_server["client_kwargs"]["endpoint_url"], seed=7) as proxy:
        yield proxy


def task_config(tmp_path, fmt: str, s3_server, proxy: FaultProxy, prefix: str):
    """A date of a table on S3 (Iceberg: its warehouse there too, its SQL catalog on local SQLite)."""
    cfg = table_config(
        tmp_path,
        fmt,
        output_path=f"s3://{BUCKET}/{prefix}/table",
        storage_options=store_options(s3_server, proxy),
        rows_per_range=50,
        run_key=f"dag/{prefix}/task/-1",
    )
    if fmt == "iceberg":
        cfg.table.catalog["warehouse"] = f"s3://{BUCKET}/{prefix}/warehouse"
    return cfg


def table_rows(cfg, s3_server):
    """The table's rows in its current snapshot, read through the store directly (not the proxy)."""
    if cfg.table.format == "delta":
        from deltalake import DeltaTable

        from airflow_provider_raybatch.pipeline.tables.delta_storage import delta_storage_options

        options = delta_storage_options(cfg.output_path, s3_server)
        return DeltaTable(cfg.output_path, storage_options=options).to_pyarrow_table()
    from airflow_provider_raybatch.pipeline.tables.iceberg import load_catalog
    from airflow_provider_raybatch.pipeline.tables.iceberg_storage import file_io_properties

    catalog = load_catalog({**file_io_properties(cfg.output_path, s3_server), **cfg.table.catalog})
    return catalog.load_table(IDENTIFIER).scan().to_arrow()


def run_task(cfg, s3_server, proxy: FaultProxy, tries: int = 3) -> list:
    """Tries of one task until one succeeds; the proxy's rules hold for the first try only."""
    outcomes: list[object] = []
    for attempt in range(tries):
        if attempt:
            proxy.clear()
        try:
            summary = run_batch_inference(cfg)
        except NotRetryableError:
            raise  # a store fault must never fail a task for good
        except Exception as e:  # noqa: BLE001 - a failed try: Airflow retries it
            outcomes.append(e)
            continue
        outcomes.append(summary)
        assert verify_table(OutputRef.of(cfg)) == []
        rows = table_rows(cfg, s3_server)
        assert_exactly_once(rows, range(ROWS))
        assert summary.rows_out == rows.num_rows == summary.rows_in
        return outcomes
    pytest.fail(f"no try of {tries} succeeded: {outcomes}")


@pytest.mark.parametrize("kind", ["error_after", "drop_after"])
@pytest.mark.parametrize(("fmt", "write"), CASES)
def test_every_table_write_with_an_unknown_outcome_ends_exactly_once(tmp_path, s3_server, proxy, fmt, write, kind):
    """Every request of the write, during the first try, applied by the store but answered with
    an error (or its reply lost): the task ends, within its retries, with every row once in the
    table and a summary that counts exactly what is there; a rerun adds nothing."""
    pytest.importorskip("deltalake" if fmt == "delta" else "pyiceberg")
    prefix = f"table-{fmt}-{uuid.uuid4().hex[:8]}"
    write_input(tmp_path / "in", [50, 50])
    cfg = task_config(tmp_path, fmt, s3_server, proxy, prefix)
    method, path = {**WRITES, **FORMAT_WRITES[fmt]}[write]
    rule = proxy.add(kind, method=method, path=path, times=3 if write.startswith("iceberg") else None)
    run_task(cfg, s3_server, proxy)
    assert rule.applied > 0, f"no {write} request met the fault"
    assert run_batch_inference(cfg).ranges_skipped == 2
    assert_exactly_once(table_rows(cfg, s3_server), range(ROWS))
