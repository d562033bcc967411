"""Where a task's pipeline runs, behind one interface (:class:`.base.PipelineRunner`): in the task
on an embedded local Ray (:mod:`.embedded`), or as a Ray Job on a cluster (:mod:`.ray_job`);
:func:`.factory.runner_for` picks which.

The operators keep Airflow's concerns (rendering, XCom, deferral, which failures are retried);
a runner runs or plans a :class:`~airflow_provider_raybatch.pipeline.config.BatchInferenceConfig`,
waits for the job that does, and reads back what the job left.
"""
