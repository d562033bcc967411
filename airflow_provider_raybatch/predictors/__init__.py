"""Ready-made predictors (they run on Ray: no Airflow imports)."""
