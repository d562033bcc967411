"""ReplicaResources: replicas from an int or (min, max), the checks, and what Ray Data receives."""

from __future__ import annotations

import pytest

from airflow_provider_raybatch.pipeline import ConfigError, ReplicaResources, Stage


def test_min_and_max_replicas_from_an_int_or_a_pair():
    fixed, pool = ReplicaResources(concurrency=3), ReplicaResources(concurrency=[1, 4])
    assert (fixed.min_replicas, fixed.max_replicas) == (3, 3)
    pool.validate("pool")  # a rendered or JSON [min, max] becomes a tuple
    assert pool.concurrency == (1, 4) and (pool.min_replicas, pool.max_replicas) == (1, 4)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"concurrency": (3, 2)}, r"where: concurrency must be an int >= 1 or \(min, max\) with 1 <= min <= max"),
        ({"concurrency": 0}, r"where: concurrency must be an int >= 1 or \(min, max\), got 0"),
        ({"concurrency": "2"}, r"concurrency must be an int >= 1 or \(min, max\), got '2'"),
        ({"batch_size": 0}, "where: batch_size must be an integer >= 1 or None, got 0"),
        ({"num_gpus": None}, "where: num_cpus and num_gpus must be numbers, got 1, None"),
        ({"num_cpus": -1}, "where: num_cpus and num_gpus must be >= 0"),
        ({"memory": "1G"}, "where: memory must be a number of bytes or None, got '1G'"),
        ({"resources": {"big": "one"}}, "where: resources must be a dict of resource name to amount"),
    ],
)
def test_bad_values_are_refused_naming_where(settings, message):
    with pytest.raises(ConfigError, match=message):
        ReplicaResources(**settings).validate("where")


def test_map_batches_arguments_are_an_actor_pool_with_the_reservations():
    from ray.data import ActorPoolStrategy

    fixed = ReplicaResources(batch_size=64, concurrency=2, num_cpus=0.5, num_gpus=1, memory=2**30)
    assert fixed.map_batches_kwargs() == {
        "batch_size": 64,
        "compute": ActorPoolStrategy(size=2),
        "num_cpus": 0.5,
        "num_gpus": 1,
        "memory": 2**30,
    }  # unset ones left out: Ray 2.55's operator fusion fails on a remote argument that is None
    pool = ReplicaResources(concurrency=(1, 3), accelerator_type="L4", resources={"big": 1}).map_batches_kwargs()
    assert pool["compute"] == ActorPoolStrategy(min_size=1, max_size=3)
    assert (pool["accelerator_type"], pool["resources"]) == ("L4", {"big": 1})


def test_a_stage_is_its_replicas_resources():
    stage = Stage("pkg.mod:Model", {"path": "m"}, num_gpus=1, batch_size=64, concurrency=2, memory=10)
    resources = ReplicaResources(**stage.resource_kwargs())
    assert resources == ReplicaResources(num_gpus=1, batch_size=64, concurrency=2, memory=10)
    assert stage.map_batches_kwargs() == resources.map_batches_kwargs()
    with pytest.raises(ConfigError, match=r"stage 'Model': concurrency must be an int >= 1"):
        Stage("pkg.mod:Model", concurrency=(2, 1)).validate()


def test_concurrency_none_is_decided_for_the_cpus_the_run_may_use():
    from airflow_provider_raybatch.pipeline.resources import auto_replicas

    auto = ReplicaResources(concurrency=None)
    auto.validate("auto")
    assert (auto.min_replicas, auto.max_replicas) == (1, 1)  # before the run decides
    # Replicas that read their own rows: every CPU; with read tasks, one CPU is left for them.
    assert auto_replicas([auto], cpus=2, read_cpus=0) == [2]
    assert auto_replicas([auto], cpus=8, read_cpus=1) == [7]
    assert auto_replicas([ReplicaResources(concurrency=None, num_cpus=0.5)], cpus=2, read_cpus=0) == [4]
    # Never fewer than one, never more than there is work for.
    assert auto_replicas([auto], cpus=0.5, read_cpus=0) == [1]
    assert auto_replicas([auto], cpus=16, read_cpus=0, work_units=3) == [3]
    # Other stages' replicas come first; stages on CPUs share what is left; a GPU stage gets one.
    gpu = ReplicaResources(concurrency=None, num_gpus=1)
    fixed = ReplicaResources(concurrency=2)
    assert auto_replicas([auto, gpu], cpus=4, read_cpus=0) == [3, 1]
    assert auto_replicas([fixed, auto, auto], cpus=8, read_cpus=0) == [2, 3, 3]
    assert auto_replicas([ReplicaResources(concurrency=None, num_cpus=0)], cpus=4) == [1]
