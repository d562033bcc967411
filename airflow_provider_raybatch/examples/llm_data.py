"""Data and tiny models for the LLM / VLM quick start (``make demo-llm``).

``python -m airflow_provider_raybatch.examples.llm_data prepare --root .demo --date 2026-11-21``
builds the tiny models (``models/tiny-llava``, ``models/tiny-qwen2``), writes a day of images
(scikit-learn's digits as PNG, plus two corrupt ones that land in the rejects) to
``images/<date>/`` and a companies table to ``companies/``. ``report`` prints what the two
example DAGs wrote.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_raybatch.examples import demo_args

INDUSTRIES = ["Technology", "Finance", "Healthcare", "Retail", "Energy"]
_NAMES = {
    "Technology": ["Byte", "Quantum", "Cloud", "Pixel", "Data", "Silicon"],
    "Finance": ["Capital", "Trust", "Ledger", "Credit", "Equity", "Savings"],
    "Healthcare": ["Care", "Medic", "Vital", "Cure", "Health", "Clinic"],
    "Retail": ["Mart", "Shop", "Outlet", "Goods", "Store", "Bazaar"],
    "Energy": ["Solar", "Power", "Volt", "Grid", "Fuel", "Wind"],
}
_SUFFIXES = ["Corp", "Inc", "Group", "Labs", "Partners", "Co"]


def digit_png(pixels: np.ndarray, size: int = 32) -> bytes:
    """An 8x8 digit (values 0..16) as a grey PNG of ``size`` pixels."""
    from PIL import Image

    image = Image.fromarray((pixels.reshape(8, 8) * (255 / 16)).astype(np.uint8), mode="L")
    out = io.BytesIO()
    image.resize((size, size), Image.Resampling.NEAREST).save(out, format="PNG")
    return out.getvalue()


def write_images(folder: Path, rows: int = 64) -> int:
    """``rows`` digit images as Parquet (``id``, ``label``, ``jpg`` bytes), the last two corrupt."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = [digit_png(digits.data[i]) for i in range(rows)]
    images[-2] = images[-2][: len(images[-2]) // 2]  # a truncated file
    images[-1] = b"not an image at all"
    table = pa.table(
        {
            "id": pa.array(np.arange(rows, dtype=np.int64)),
            "label": pa.array(digits.target[:rows].astype(np.int64)),
            "jpg": pa.array(images, pa.binary()),
        }
    )
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, folder / "images.parquet", row_group_size=32)
    return rows


def companies_table(rows: int = 300, seed: int = 0) -> pa.Table:
    """Made-up company names with the industry their name suggests."""
    rng = np.random.default_rng(seed)
    names, industries = [], []
    for i in range(rows):
        industry = INDUSTRIES[i % len(INDUSTRIES)]
        word = _NAMES[industry][rng.integers(len(_NAMES[industry]))]
        names.append(f"{word}{chr(65 + i % 26)} {_SUFFIXES[rng.integers(len(_SUFFIXES))]}")
        industries.append(industry)
    return pa.table(
        {
            "id": pa.array(np.arange(rows, dtype=np.int64)),
            "Company": pa.array(names),
            "true_industry": pa.array(industries),
        }
    )


def write_companies(folder: Path, rows: int = 300) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(companies_table(rows), folder / "companies.parquet", row_group_size=100)
    return rows


def main(argv: list[str] | None = None) -> None:
    command, root, date = demo_args(__doc__, argv)
    if command == "prepare":
        from airflow_provider_raybatch.examples.tiny_models import build_all

        # What exists is kept: rewriting a finished run's input would change it, which resume
        # rightly refuses, so the demo runs again as the no-op it is.
        models, images, companies = root / "models", root / "images" / date, root / "companies"
        if not all((models / name / "config.json").exists() for name in ("tiny-llava", "tiny-qwen2")):
            build_all(models)
        if not (images / "images.parquet").exists():
            write_images(images)
        if not (companies / "companies.parquet").exists():
            write_companies(companies)
        print(f"tiny models in {models}; images for {date} in {images}; companies in {companies}")
        return
    captions = root / "captions" / date
    table = pq.read_table(captions)
    rejects = pq.read_table(captions / "_rejects")
    print(f"captions: {captions}: {table.num_rows} rows; e.g. {table.slice(0, 2).to_pylist()}")
    print(f"rejects: {rejects.num_rows} rows: {rejects.select(['id', 'reason']).to_pylist()}")
    classified = pq.read_table(root / "industries")
    counts = dict(
        zip(*np.unique(classified["industry"].to_numpy(zero_copy_only=False), return_counts=True), strict=True)
    )
    print(f"industries: {root / 'industries'}: {classified.num_rows} rows, answers {counts}")


if __name__ == "__main__":
    main()
