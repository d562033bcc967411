"""The provider's Airflow plugin: the FastAPI app of :mod:`.api`, and the external views that frame
its pages on Airflow's task instance, DAG run and DAG pages (Airflow 3.1+).

Registered twice over, as Airflow providers do: in ``get_provider_info()``'s ``plugins`` (which
Airflow 3.3 loads only with ``[core] lazy_discover_providers = False``) and as the
``airflow.plugins`` entry point (always loaded): ``airflow plugins`` lists it without a user step.
Importing it imports FastAPI and the plugin's modules, never Ray, torch or pyarrow.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from airflow_provider_raybatch.plugins.api import URL_PREFIX, app

#: The tabs' routes on Airflow's pages (``.../plugin/<route>``): one per destination.
TASK_INSTANCE_ROUTE, DAG_RUN_ROUTE, DAG_ROUTE = "raybatch-output", "raybatch-run", "raybatch-dag"
#: The external views' hrefs: Airflow fills in the placeholders (URL-encoded), same origin.
TASK_INSTANCE_HREF = URL_PREFIX + "/ti/{DAG_ID}/{RUN_ID}/{TASK_ID}?map_index={MAP_INDEX}"
DAG_RUN_HREF = URL_PREFIX + "/run/{DAG_ID}/{RUN_ID}"
DAG_HREF = URL_PREFIX + "/dag/{DAG_ID}"


class RayBatchPlugin(AirflowPlugin):
    """Ray batch outputs: progress, rejects, lease holder and verifier of an output, in Airflow's UI."""

    name = "raybatch"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "Ray batch outputs"}]
    external_views = [
        {
            "name": "Ray batch output",
            "href": TASK_INSTANCE_HREF,
            "destination": "task_instance",
            "url_route": TASK_INSTANCE_ROUTE,
        },
        {"name": "Ray batch outputs", "href": DAG_RUN_HREF, "destination": "dag_run", "url_route": DAG_RUN_ROUTE},
        {"name": "Ray batch outputs", "href": DAG_HREF, "destination": "dag", "url_route": DAG_ROUTE},
    ]
