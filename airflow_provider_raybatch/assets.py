"""The output folder as an Airflow Asset: declared as the task's outlet, its event carries the summary.

An output path is usually templated per date (``s3://bucket/preds/{{ ds }}/``) while an Asset's
URI is fixed when the DAG is parsed. So the Asset names the output's static part (everything
before the first template), and each asset event says which folder the run wrote and what it
holds in its ``extra``: the run's summary, including the rendered ``output_path``.
"""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset

from airflow_provider_raybatch.pipeline.store.urls import store_of

if TYPE_CHECKING:
    from airflow.sdk import Context


def default_asset(output_path: str) -> Asset | None:
    """The Asset of an output's static prefix: ``file:///data/preds`` for ``/data/preds/{{ ds }}/``.

    Object stores keep their bucket or container and get their canonical scheme: ``s3://b/preds``,
    ``gs://b/preds`` (also for ``gcs://``), ``abfs://container/preds`` (also for ``az://``, ``abfss://``).

    None when there is no usable static part (a relative path, or a template in the bucket).
    """
    if not isinstance(output_path, str):
        return None
    static = output_path.split("{{", 1)[0].split("{%", 1)[0]
    if static != output_path:
        static = static.rsplit("/", 1)[0]  # drop a partial name before the template: out/day={{ ds }}
    static = static.rstrip("/")
    if "://" in static:
        scheme, _, rest = static.partition("://")
        bucket = rest.split("/", 1)[0]
        if not bucket:
            return None
        store = store_of(static)
        return Asset(uri=f"{store.scheme if store else scheme}://{rest}")
    if not static.startswith("/") or not posixpath.normpath(static).strip("/"):
        return None
    return Asset(uri=f"file://{posixpath.normpath(static)}")


def resolve_asset(asset: Asset | str | None, output_path: str, default: object) -> Asset | None:
    """The operator's ``asset`` argument as an Asset (or None): ``default`` derives it from the path."""
    if asset is default:
        return default_asset(output_path)
    if asset is None or isinstance(asset, Asset):
        return asset
    if isinstance(asset, str):
        return Asset(asset)
    raise TypeError(f"asset must be an Asset, a URI string or None, got {type(asset).__name__}")


def attach_summary(context: Context, asset: Asset | None, summary: dict[str, Any]) -> None:
    """Put the run's summary (JSON only: counts, timings, the rendered output path) on the asset event."""
    if asset is None:
        return
    context["outlet_events"][asset].extra.update(summary)
