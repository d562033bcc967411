"""The provider's Airflow UI plugin: an output's progress on the task instance, DAG run and DAG pages.

- :mod:`.plugin`: the :class:`~airflow.plugins_manager.AirflowPlugin` (the FastAPI app, the
  external views that frame its pages on Airflow's pages);
- :mod:`.api`: the FastAPI app: JSON endpoints and the HTML pages;
- :mod:`.access`: Airflow's own authentication and DAG permissions, as dependencies;
- :mod:`.outputs`: a task instance to its output (rendered fields, serialized DAG, connections);
- :mod:`.figures`: what the endpoints answer, read from the output's bookkeeping only;
- ``static/``: the pages' HTML, CSS and JavaScript (no build step).

Nothing here imports Ray or torch: the api-server that serves it is no place for them.
"""
