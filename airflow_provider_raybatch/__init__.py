"""Apache Airflow provider for checkpointed offline batch inference on Ray Data.

Importing this package, its hooks or its operators imports neither Ray nor any model library:
DAG files that use them stay cheap to parse.
"""

__version__ = "0.1.0"
