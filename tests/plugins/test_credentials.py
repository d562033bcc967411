"""The plugin reads a remote output with the task's connection, resolved on the server (outside
any task, as the api-server does), and no secret or connection id reaches its answers."""

from __future__ import annotations

import json

from airflow_provider_raybatch.plugins import figures
from airflow_provider_raybatch.plugins.outputs import ResolvedOutput, TaskRef
from benchmarks.status import finish, write_output
from benchmarks.support.data import moto_s3
from tests.support.ui_outputs import environment

SECRET = "s3cr3t-for-the-server-only"


def test_a_remote_output_is_read_with_the_tasks_connection_and_no_secret_is_answered():
    options, server = moto_s3("ui-bucket")
    try:
        writer = write_output("s3://ui-bucket/out", options, ranges=20, per_segment=5, done=12)
        connection = {
            "conn_type": "aws",
            "login": "testing",
            "password": SECRET,
            "extra": {"endpoint_url": options["client_kwargs"]["endpoint_url"], "region_name": "us-east-1"},
        }
        with environment({"AIRFLOW_CONN_UI_S3_CONN": json.dumps(connection)}):

            def output(conn_id: str) -> ResolvedOutput:
                return ResolvedOutput(
                    TaskRef("d", "r", "t"), "s3://ui-bucket/out", "parquet", None, None, "rendered", "success", 1,
                    False, conn_ids={"aws_conn_id": conn_id},
                )  # fmt: skip

            document = figures.output_figures(output("ui_s3_conn"))
            [status] = document["outputs"]
            assert document["found"] and status["ranges_committed"] == 12 and status["ranges_planned"] == 20
            finish(*writer, ranges=20, per_segment=5)  # done: the verifier reads every file of it
            verdict = figures.verify(output("ui_s3_conn"))
            assert verdict["ok"] is False and verdict["faults"]  # its data files were never written
            missing = figures.output_figures(output("no_such_conn"))
            assert missing["found"] is False and "no_such_conn" in missing["message"]
        for answer in (document, verdict, missing):
            text = json.dumps(answer, default=str)
            assert SECRET not in text and "testing" not in text and "ui_s3_conn" not in text
    finally:
        server.stop()
