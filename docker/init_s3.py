"""Create the stack's bucket and put the demo's model and one day of input in it.

Run by the compose file's ``s3-init`` service (Airflow image: the provider, s3fs and
scikit-learn are installed); the store's address and credentials come from the ``AWS_*``
environment variables. Idempotent: a rerun overwrites the demo files with the same content.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import s3fs

from airflow_provider_raybatch.examples import digits


def main() -> None:
    bucket = os.environ.get("RAYBATCH_BUCKET", "raybatch")
    date = os.environ.get("RAYBATCH_DEMO_DATE", "2026-11-21")
    fs = s3fs.S3FileSystem()
    if not fs.exists(bucket):
        fs.mkdir(bucket)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        digits.train(root / "model" / "digits.safetensors")
        rows = digits.write_input(root / "input" / date)
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            fs.put_file(str(path), f"{bucket}/demo/{path.relative_to(root).as_posix()}")
    print(f"s3://{bucket}/demo: model and {rows} rows of input for {date}")


if __name__ == "__main__":
    main()
