"""The asset events an Airflow metadata DB holds (as a downstream DAG would see them)."""

from __future__ import annotations


def asset_events(uri: str) -> list[dict]:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(
            select(AssetEvent.extra, AssetEvent.source_task_id)
            .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
            .where(AssetModel.uri == uri)
            .order_by(AssetEvent.id)
        ).all()
    return [{"extra": extra, "task_id": task_id} for extra, task_id in rows]
