"""Tiny random BERT encoders saved as sentence-transformers folders, for the embedding tests.

Real ``save_pretrained`` folders with a WordPiece tokenizer, ``modules.json``,
the pooling module's ``1_Pooling/config.json`` and ``sentence_bert_config.json``: the files the
``transformers`` embedding engine reads, with random weights.
"""

from __future__ import annotations

import json
from pathlib import Path

WORDS = [
    "the",
    "a",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "with",
    "as",
    "by",
    "at",
    "from",
    "that",
    "this",
    "it",
    "be",
    "are",
    "or",
    "an",
    "which",
    "what",
    "query",
    "passage",
    "document",
    "search",
    "index",
    "vector",
    "model",
    "text",
    "row",
    "embed",
    "cat",
    "dog",
    "sat",
    "mat",
    "river",
    "bank",
    "money",
]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def build_tiny_bert(
    out: Path, hidden: int = 32, max_seq_length: int = 16, pooling: str = "mean", seed: int = 0
) -> Path:
    """A 2-layer BertModel of ``hidden`` dimensions, whose sentence-transformers config cuts texts
    at ``max_seq_length`` tokens and pools by ``pooling`` (``"mean"`` or ``"cls"``), saved to ``out``."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    torch.manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)] + list(".,:;!?'-")
    vocab = SPECIAL + letters + [f"##{c}" for c in letters] + WORDS
    tokenizer = BertTokenizerFast(vocab={token: i for i, token in enumerate(vocab)}, do_lower_case=True)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=64,
    )
    BertModel(config).eval().save_pretrained(out)
    tokenizer.save_pretrained(out)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (out / "modules.json").write_text(json.dumps(modules))
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": hidden,
                "pooling_mode_cls_token": pooling == "cls",
                "pooling_mode_mean_tokens": pooling == "mean",
            }
        )
    )
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length}))
    return out


def build_tiny_clip(out: Path, projection: int = 16, seed: int = 0) -> Path:
    """A 2-layer CLIPModel (texts and 32x32 images into ``projection`` dimensions) with a WordPiece
    tokenizer and a CLIP image processor, saved to ``out``."""
    import torch
    from transformers import BertTokenizerFast, CLIPConfig, CLIPImageProcessor, CLIPModel

    torch.manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    vocab = SPECIAL + WORDS
    tokenizer = BertTokenizerFast(vocab={token: i for i, token in enumerate(vocab)}, do_lower_case=True)
    tower = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
    config = CLIPConfig(
        # The text tower pools at its end-of-text token: the tokenizer's [SEP].
        text_config={
            **tower,
            "vocab_size": len(vocab),
            "max_position_embeddings": 32,
            **{"pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 3},
        },
        vision_config={**tower, "image_size": 32, "patch_size": 8},
        projection_dim=projection,
    )
    CLIPModel(config).eval().save_pretrained(out)
    tokenizer.save_pretrained(out)
    CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(out)
    return out
