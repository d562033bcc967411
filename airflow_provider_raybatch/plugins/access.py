"""Who may call the plugin: Airflow's own authentication and DAG permissions, as FastAPI dependencies.

A plugin's FastAPI app is mounted in the api-server without Airflow's protection, so every route
of :mod:`.api` depends on one of these. They are Airflow's: ``requires_access_dag`` authenticates
the caller (:func:`airflow.api_fastapi.core_api.security.get_user`: the ``Authorization: Bearer``
token, else the UI's JWT cookie, which a same-origin iframe sends) and asks the configured auth
manager's ``is_authorized_dag`` for the ``dag_id`` in the path. No token: 401. A token the auth
manager refuses for that DAG: 403.

- reading an output's figures: ``GET`` on the DAG's task instances;
- running the verifier (server work a viewer should not start at will): ``PUT`` on them, what
  clearing or marking a task instance needs.
"""

from __future__ import annotations

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.core_api.security import requires_access_dag
from fastapi import Depends

#: Read a DAG's task instances (and its runs): every route that shows figures.
can_read = Depends(requires_access_dag("GET", DagAccessEntity.TASK_INSTANCE))
#: Act on a DAG's task instances: the verifier.
can_verify = Depends(requires_access_dag("PUT", DagAccessEntity.TASK_INSTANCE))
