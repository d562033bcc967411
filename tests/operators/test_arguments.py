"""Each argument the operators share with the config is declared once: same name, default, type and description."""

from __future__ import annotations

import inspect
import re
from dataclasses import MISSING, fields

import pytest

from airflow_provider_raybatch.operators.arguments import RESOURCE_ARGUMENTS, SHARED_ARGUMENTS
from airflow_provider_raybatch.operators.batch_inference import RayBatchInferenceOperator
from airflow_provider_raybatch.operators.chat import ChatOperator
from airflow_provider_raybatch.operators.embedding import EmbeddingOperator
from airflow_provider_raybatch.operators.ray_pipeline import RayPipelineOperator
from airflow_provider_raybatch.pipeline.config import BatchInferenceConfig, TableOutput
from airflow_provider_raybatch.pipeline.errors import ConfigError
from airflow_provider_raybatch.pipeline.resources import ReplicaResources

OPERATOR = inspect.signature(RayPipelineOperator.__init__).parameters
#: The config's fields the operator takes under the same name (computed: a new one is checked too), but
#: ``table``: the operator's is the Iceberg table's name (the config's ``table.identifier``).
SHARED = [f for f in fields(BatchInferenceConfig) if f.name in OPERATOR and f.name != "table"]
#: The table output's fields the operator takes as ``table_<name>`` (``table_partition`` has its own default).
SHARED_TABLE = [f for f in fields(TableOutput) if f.name in ("commit_interval", "add_columns")]
#: What the operator accepts beyond the config's type, and renders to it.
WIDER = {"progress_timeout": "float | timedelta | None"}


def params(doc: str) -> dict[str, str]:
    """``:param name: text`` of a docstring, by name, its text on one line."""
    found = re.findall(r":param (\w+):(.*?)(?=\n\s*:param |\Z)", inspect.cleandoc(doc), re.DOTALL)
    return {name: " ".join(text.split()) for name, text in found}


def test_every_argument_the_operator_shares_with_the_config_has_its_description_composed():
    assert [f.name for f in SHARED] == list(SHARED_ARGUMENTS)


@pytest.mark.parametrize(
    ("name", "field"), [(f.name, f) for f in SHARED] + [(f"table_{f.name}", f) for f in SHARED_TABLE]
)
def test_a_shared_argument_has_the_config_s_default_type_and_description(name, field):
    param = OPERATOR[name]
    default = inspect.Parameter.empty if field.default is MISSING else field.default
    assert param.default == default
    assert param.annotation == WIDER.get(field.name, field.type)
    config_doc = params(BatchInferenceConfig.__doc__ if field in SHARED else TableOutput.__doc__)[field.name]
    # The operator's text is the config's, then how the operator renders it.
    assert params(RayPipelineOperator.__doc__)[name].startswith(config_doc)


@pytest.mark.parametrize("cls", [BatchInferenceConfig, TableOutput, ReplicaResources])
def test_every_config_field_is_described_in_the_class_docstring(cls):
    documented = params(cls.__doc__)
    assert list(documented) == [f.name for f in fields(cls)]
    assert all(documented.values())


#: The operators that run replicas, whose resource arguments are ReplicaResources' fields.
REPLICA_OPERATORS = (RayBatchInferenceOperator, ChatOperator, EmbeddingOperator)
#: Where an operator's default is its own on purpose (its signature says why).
OWN_DEFAULTS = {
    RayBatchInferenceOperator: {"concurrency": None},
    ChatOperator: {"batch_size": 16, "num_cpus": 0.5, "num_gpus": None},
    EmbeddingOperator: {"batch_size": 16, "num_cpus": 0.5, "num_gpus": None},
}
#: Where an operator takes less than the field's type: a predictor's replica has a GPU count, and the chat
#: operators' replicas are a number (or a pool) of engines with a batch size.
NARROWER = {
    RayBatchInferenceOperator: {"num_gpus": "float"},
    ChatOperator: {"batch_size": "int", "concurrency": "int | tuple[int, int]"},
    EmbeddingOperator: {"batch_size": "int", "concurrency": "int | tuple[int, int]"},
}


@pytest.mark.parametrize("operator", REPLICA_OPERATORS)
def test_every_resource_argument_an_operator_takes_has_its_description_composed(operator):
    signature = inspect.signature(operator.__init__).parameters
    taken = [f.name for f in fields(ReplicaResources) if RESOURCE_ARGUMENTS[f.name] in signature]
    assert taken == list(operator.resource_arguments)
    assert "ray_resources" in signature and "resources" not in signature  # Airflow's own, on BaseOperator


@pytest.mark.parametrize(
    ("operator", "field"),
    [
        pytest.param(op, f, id=f"{op.__name__}.{f.name}")
        for op in REPLICA_OPERATORS
        for f in fields(ReplicaResources)
        if f.name in op.resource_arguments
    ],
)
def test_a_resource_argument_has_the_replicas_default_type_and_description(operator, field):
    name = RESOURCE_ARGUMENTS[field.name]
    param = inspect.signature(operator.__init__).parameters[name]
    assert param.default == OWN_DEFAULTS[operator].get(field.name, field.default)
    assert param.annotation == NARROWER[operator].get(field.name, field.type)
    # The operator's text is the field's, then what the operator adds (its own default, templated).
    assert params(operator.__doc__)[name].startswith(params(ReplicaResources.__doc__)[field.name])


SHARD = {"index": 0, "count": 1, "range_ids": ["a-0-10"], "rows": 10}


@pytest.mark.parametrize(
    ("old", "new", "value"), [("plan_partitions", "plan_shards", 3), ("partition", "shard", SHARD)]
)
def test_the_shard_arguments_old_names_still_work_with_a_warning_naming_the_new_one(old, new, value):
    from airflow.exceptions import AirflowProviderDeprecationWarning

    with pytest.warns(AirflowProviderDeprecationWarning, match=f"{old} is deprecated: use {new}"):
        operator = RayPipelineOperator(task_id="t", input_path="/in", output_path="/out", **{old: value})
    assert getattr(operator, new) == value
    assert operator.asset is None  # as with the new name: a planning or mapped task declares no asset


@pytest.mark.parametrize(
    ("old", "new", "value"), [("plan_partitions", "plan_shards", 3), ("partition", "shard", SHARD)]
)
def test_a_shard_argument_given_under_both_names_is_refused_naming_both(old, new, value):
    with pytest.raises(ConfigError, match=f"{old} is the deprecated name of {new}"):
        RayPipelineOperator(task_id="t", input_path="/in", output_path="/out", **{old: value, new: value})


def test_a_map_index_template_of_an_earlier_version_still_reads_the_shard_as_task_partition():
    from airflow.exceptions import AirflowProviderDeprecationWarning

    operator = RayPipelineOperator(task_id="t", input_path="/in", output_path="/out", shard=SHARD)
    with pytest.warns(AirflowProviderDeprecationWarning, match="partition is deprecated: use shard"):
        assert operator.partition == SHARD
