"""Tiny random chat models built offline, for the tests and the quick start (no model hub).

``python -m airflow_provider_raybatch.examples.tiny_models --out DIR`` writes ``DIR/tiny-llava``
(a Llava: CLIP vision tower + Qwen2 text model, with ``LlavaProcessor``) and ``DIR/tiny-qwen2``
(a Qwen2 causal LM), each saved with ``save_pretrained`` and loadable with ``from_pretrained``.
Their weights are random: they produce real tokens through the real code path, not sense.
The tokenizer is a byte-level BPE trained in memory; no torchvision is needed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

IMAGE_TOKEN = "<image>"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>", IMAGE_TOKEN]
# A ChatML template that renders both plain string content and OpenAI-style content parts.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>\n{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_CORPUS = [
    "You are a helpful assistant that generates accurate and descriptive captions for images.",
    "Describe this image in detail. Focus on the main subjects, actions, and setting.",
    "What industry is this company in? Answer with one word.",
    "Technology Finance Healthcare Retail Energy Manufacturing Transportation Media",
    "a handwritten digit zero one two three four five six seven eight nine on a dark background",
    "The quick brown fox jumps over the lazy dog. 0123456789 ,.;:!?'\"()[]{}<>-_/\\@#$%^&*+=",
]


def build_tokenizer(vocab_size: int = 600):
    """A byte-level BPE tokenizer with ChatML special tokens and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<pad>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=[IMAGE_TOKEN],
        chat_template=CHAT_TEMPLATE,
    )


def _text_config(tokenizer, max_positions: int):
    from transformers import Qwen2Config

    # Heads of 32 dimensions: the smallest vLLM's CPU attention takes (it refuses 8 or 16).
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=max_positions,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )


def build_tiny_qwen2(out: Path, max_positions: int = 512, seed: int = 0) -> Path:
    """A 2-layer Qwen2ForCausalLM with the tokenizer above, saved to ``out``."""
    import torch
    from transformers import GenerationConfig, Qwen2ForCausalLM

    torch.manual_seed(seed)
    tokenizer = build_tokenizer()
    model = Qwen2ForCausalLM(_text_config(tokenizer, max_positions))
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def build_tiny_llava(out: Path, image_size: int = 32, max_positions: int = 512, seed: int = 0) -> Path:
    """A Llava (tiny CLIP vision tower + tiny Qwen2) with a ``LlavaProcessor``, saved to ``out``."""
    import torch
    from transformers import CLIPVisionConfig, GenerationConfig, LlavaConfig, LlavaForConditionalGeneration
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
    from transformers.models.llava.processing_llava import LlavaProcessor

    torch.manual_seed(seed)
    tokenizer = build_tokenizer()
    patch_size = 8
    vision = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=image_size,
        patch_size=patch_size,
        projection_dim=32,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=_text_config(tokenizer, max_positions),
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
        projector_hidden_act="gelu",
    )
    model = LlavaForConditionalGeneration(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=patch_size,
        vision_feature_select_strategy="default",
        chat_template=CHAT_TEMPLATE,
        image_token=IMAGE_TOKEN,
        num_additional_image_tokens=1,  # CLIP's CLS token
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


def build_all(out: Path) -> dict[str, Path]:
    return {"llava": build_tiny_llava(out / "tiny-llava"), "qwen2": build_tiny_qwen2(out / "tiny-qwen2")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder that receives tiny-llava/ and tiny-qwen2/")
    args = parser.parse_args(argv)
    for name, path in build_all(args.out.resolve()).items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
