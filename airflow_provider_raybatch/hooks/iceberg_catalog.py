"""The Iceberg catalog of a table output: its pyiceberg properties from an Airflow connection.

No connection (the default ``iceberg_default`` not defined) is the embedded default: pyiceberg's
SQL catalog on SQLite in ``$AIRFLOW_HOME/raybatch/iceberg/``, for one machine (a laptop, a single
Airflow worker). A team's catalog is a connection: PostgreSQL (or any database SQLAlchemy reaches)
for the SQL catalog, or a REST catalog (Polaris, Unity, Tabular, Nessie, Gravitino...).
"""

from __future__ import annotations

import os
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook
from airflow.sdk.log import mask_secret

from airflow_provider_raybatch.version_compat import AirflowNotFoundException

if TYPE_CHECKING:
    from airflow.sdk import Connection

#: Connection types whose fields spell a SQLAlchemy URL of the SQL catalog's database.
_SQL_DRIVERS = {"postgres": "postgresql+psycopg2", "mysql": "mysql+pymysql", "sqlite": "sqlite"}


class IcebergCatalogHook(BaseHook):
    """The pyiceberg catalog properties of a connection (any connection type).

    - ``extra`` holds pyiceberg's catalog properties as they are (``type``, ``uri``, ``warehouse``,
      ``s3.endpoint``, ``credential``, ``token``...); they win over what the fields below give.
    - A ``postgres`` (or ``mysql``, ``sqlite``) connection is the SQL catalog on that database:
      its host, port, login, password and schema make the ``uri``.
    - Any other connection with a host is a REST catalog at that URL; login and password, when
      set, are its OAuth2 client id and secret (``credential``), as the Apache Iceberg provider's
      connection has them.

    Secrets (the password, ``credential``, ``token``) are masked in the task's log. A job on a Ray
    cluster never receives them: its driver loads the catalog named ``raybatch`` from the
    cluster's own pyiceberg configuration (``PYICEBERG_CATALOG__RAYBATCH__URI``... or ``.pyiceberg.yaml``).

    :param iceberg_conn_id: the connection; one that does not exist means the embedded default.
    """

    conn_name_attr = "iceberg_conn_id"
    default_conn_name = "iceberg_default"
    hook_name = "Iceberg catalog"

    def __init__(self, iceberg_conn_id: str | None = default_conn_name) -> None:
        super().__init__()
        self.iceberg_conn_id = iceberg_conn_id

    @cached_property
    def connection(self) -> Connection | None:
        if not self.iceberg_conn_id:
            return None
        try:
            return self.get_connection(self.iceberg_conn_id)
        except AirflowNotFoundException:
            return None

    def catalog_properties(self) -> dict[str, Any]:
        """pyiceberg's ``load_catalog`` properties of the connection (or of the embedded default)."""
        conn = self.connection
        if conn is None:
            return embedded_catalog()
        properties: dict[str, Any] = {}
        driver = _SQL_DRIVERS.get(conn.conn_type or "")
        if driver is not None:
            properties = {"type": "sql", "uri": _sqlalchemy_url(conn, driver)}
        elif conn.host:
            properties = {"type": "rest", "uri": conn.host}
            if conn.login and conn.password:
                properties["credential"] = f"{conn.login}:{conn.password}"
        properties.update(conn.extra_dejson)
        for key in ("credential", "token", "s3.secret-access-key", "s3.session-token"):
            if properties.get(key):
                mask_secret(str(properties[key]))
        if conn.password:
            mask_secret(conn.password)
        return properties


def embedded_catalog() -> dict[str, Any]:
    """The SQL catalog on SQLite in ``$AIRFLOW_HOME/raybatch/iceberg/`` (created on first use)."""
    folder = os.path.join(os.path.expanduser(os.environ.get("AIRFLOW_HOME", "~/airflow")), "raybatch", "iceberg")
    os.makedirs(folder, exist_ok=True)
    return {"type": "sql", "uri": f"sqlite:///{folder}/catalog.db", "warehouse": f"file://{folder}/warehouse"}


def _sqlalchemy_url(conn: Connection, driver: str) -> str:
    from urllib.parse import quote

    if driver == "sqlite":
        return f"sqlite:///{conn.host}"
    auth = ""
    if conn.login:
        auth = quote(conn.login, safe="") + (f":{quote(conn.password, safe='')}" if conn.password else "") + "@"
    port = f":{conn.port}" if conn.port else ""
    return f"{driver}://{auth}{conn.host}{port}/{conn.schema or ''}"
