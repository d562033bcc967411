"""Table outputs (Delta Lake, Apache Iceberg): a range's rows join the table only through a table
commit that is applied exactly once. Imported only where a table is written (``deltalake`` and
``pyiceberg`` are optional extras)."""
