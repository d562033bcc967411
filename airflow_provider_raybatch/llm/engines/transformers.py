"""The ``transformers`` engine: a Hugging Face chat model run by ``generate`` in a Ray Data actor.

A batch predictor like any other (it runs inside ``StageWorker``), on CPU or GPU. Text models load
with ``AutoTokenizer`` / ``AutoModelForCausalLM``, VLMs with ``AutoProcessor`` /
``AutoModelForImageTextToText``. With ``choices`` it does not generate: it scores each choice's
log-likelihood after the prompt (the choice's tokens and the end-of-turn token) and answers the
most likely one, so every answer is exactly one of the choices.

A row the engine cannot handle (a prompt longer than ``max_model_len``, an exception on that row
alone) is rejected as an engine error with the reason; the rest of its batch is answered.

Each answered row's tokens are counted from the tokenizer: the prompt's (image tokens included),
and those generated up to and including the end-of-turn token (for ``choices``, the chosen
choice's and its end-of-turn token: what generating it would have produced).

:class:`TransformersEngine` is the engine's registration (imported wherever engines are looked
up: it imports nothing heavy); :class:`TransformersChat` is the actor, which imports torch and
transformers when a replica starts.
"""

from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING, Any

from airflow_provider_raybatch.llm.config import PREPARED_IMAGE_COLUMN, TOKEN_OUTPUT_COLUMNS, ChatTask, EngineConfig
from airflow_provider_raybatch.llm.engines.base import Engine, register
from airflow_provider_raybatch.llm.prompts import hf_messages
from airflow_provider_raybatch.pipeline.columns import (
    ENGINE_ERROR,
    REJECT_COLUMN,
    REJECT_KIND_COLUMN,
    TOKENS_IN_COLUMN,
    TOKENS_OUT_COLUMN,
)

if TYPE_CHECKING:
    import numpy as np


@register
class TransformersEngine(Engine):
    """Hugging Face ``generate`` on CPU or GPU; ``choices`` by log-likelihood scoring of each choice."""

    name = "transformers"
    predictor = "airflow_provider_raybatch.llm.engines.transformers:TransformersChat"
    #: What the actor maps onto ``generate`` (vLLM-style names).
    sampling_params = ("max_tokens", "temperature", "top_p", "top_k", "seed", "repetition_penalty")


DEFAULT_MAX_TOKENS = 64
#: Sequences per forward pass when scoring choices (rows x choices).
SCORE_BATCH = 64


class TransformersChat:
    """Stage predictor answering a :class:`ChatTask` with a local Hugging Face model.

    :param task: the task, as ``ChatTask.to_dict()``.
    :param engine: the engine settings, as ``EngineConfig.to_dict()``; ``engine_kwargs`` may hold
        ``device``, ``dtype`` (e.g. ``"bfloat16"``), ``max_model_len``, ``num_threads``,
        ``trust_remote_code``, ``local_files_only`` (default: True for a local folder).
    """

    def __init__(self, task: dict[str, Any], engine: dict[str, Any]):
        import torch
        import transformers

        self.task = ChatTask.from_dict(task)
        self.engine = EngineConfig(**engine)
        kwargs = self.engine.engine_kwargs
        if kwargs.get("num_threads"):
            torch.set_num_threads(int(kwargs["num_threads"]))
        self.device = torch.device(kwargs.get("device") or ("cuda" if torch.cuda.is_available() else "cpu"))
        model_path = self.engine.model
        load: dict[str, Any] = {
            "local_files_only": kwargs.get("local_files_only", os.path.isdir(model_path)),
            "trust_remote_code": kwargs.get("trust_remote_code", False),
        }
        self.vision = self.task.image_column is not None
        if self.vision:
            self.processor = transformers.AutoProcessor.from_pretrained(model_path, **load)
            self.tokenizer = self.processor.tokenizer
            model_class = transformers.AutoModelForImageTextToText
        else:
            self.processor = None
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(model_path, **load)
            model_class = transformers.AutoModelForCausalLM
        if kwargs.get("dtype"):
            load["dtype"] = getattr(torch, kwargs["dtype"])
        self.model = model_class.from_pretrained(model_path, **load).to(self.device).eval()
        self.tokenizer.padding_side = "left"  # generation continues every row from its last token
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        text_config = self.model.config.get_text_config()
        self.max_model_len = int(kwargs.get("max_model_len") or getattr(text_config, "max_position_embeddings", 0) or 0)
        params = self.task.sampling_params
        self.max_new_tokens = int(params.get("max_tokens", DEFAULT_MAX_TOKENS))
        temperature = float(params.get("temperature", 1.0))
        self.generate_kwargs: dict[str, Any] = {"max_new_tokens": self.max_new_tokens, "do_sample": temperature > 0}
        if temperature > 0:
            self.generate_kwargs.update(
                temperature=temperature,
                top_p=float(params.get("top_p", 1.0)),
                top_k=max(int(params.get("top_k", 0)), 0),  # vLLM's -1 (no top-k) is transformers' 0
            )
        if "repetition_penalty" in params:
            self.generate_kwargs["repetition_penalty"] = float(params["repetition_penalty"])
        self.seed = params.get("seed")
        if self.task.choices:
            end = [self.tokenizer.eos_token_id] if self.tokenizer.eos_token_id is not None else []
            self.choice_ids = [self.tokenizer(c, add_special_tokens=False).input_ids + end for c in self.task.choices]
        eos = self.model.generation_config.eos_token_id
        eos = self.tokenizer.eos_token_id if eos is None else eos
        self.eos_ids = set(eos) if isinstance(eos, list) else {eos}

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        n = len(next(iter(batch.values())))
        fields = self.task.prompt_fields()
        rows = [{name: _py(batch[name][i]) for name in fields} for i in range(n)]
        texts = [
            self.tokenizer.apply_chat_template(
                hf_messages(self.task, row, self.vision), add_generation_prompt=True, tokenize=False
            )
            for row in rows
        ]
        images = [self._image(png) for png in batch[PREPARED_IMAGE_COLUMN]] if self.vision else None
        answers: list[str | None] = [None] * n
        reasons: list[str | None] = [None] * n
        tokens: list[tuple[int, int] | None] = [None] * n  # (prompt, generated) of each answered row
        if self.task.choices:
            self._choose(texts, answers, reasons, tokens)
        else:
            self._generate(texts, images, answers, reasons, tokens)
        counts = {
            TOKENS_IN_COLUMN: [t[0] if t else None for t in tokens],
            TOKENS_OUT_COLUMN: [t[1] if t else None for t in tokens],
        }
        out = {
            self.task.output_column: answers,
            REJECT_COLUMN: reasons,
            REJECT_KIND_COLUMN: [ENGINE_ERROR if r else None for r in reasons],
            **counts,
        }
        if self.task.token_columns:
            out.update(zip(TOKEN_OUTPUT_COLUMNS, counts.values(), strict=True))
        return out

    @staticmethod
    def _image(png: bytes):
        from PIL import Image

        return Image.open(io.BytesIO(png)).convert("RGB")

    def _encode(self, texts: list[str], images: list | None):
        if self.vision:
            return self.processor(images=images, text=texts, return_tensors="pt", padding=True)
        return self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)

    def _too_long(self, length: int, extra: int, what: str) -> str | None:
        if self.max_model_len and length + extra > self.max_model_len:
            return f"the prompt is {length} tokens; with {what} it exceeds max_model_len={self.max_model_len}"
        return None

    def _generate(self, texts: list[str], images: list | None, answers: list, reasons: list, tokens: list) -> None:
        inputs = self._encode(texts, images)
        lengths = inputs["attention_mask"].sum(dim=1).tolist()
        ok = []
        for i, length in enumerate(lengths):
            reasons[i] = self._too_long(int(length), self.max_new_tokens, f"max_tokens={self.max_new_tokens}")
            if reasons[i] is None:
                ok.append(i)
        if not ok:
            return
        if len(ok) < len(texts):
            inputs = self._encode([texts[i] for i in ok], [images[i] for i in ok] if images else None)
        try:
            for i, (text, generated) in zip(ok, self._run_generate(inputs), strict=True):
                answers[i], tokens[i] = text, (int(lengths[i]), generated)
        except Exception:  # noqa: BLE001 - find the rows at fault: retry one at a time
            for i in ok:
                try:
                    single = self._encode([texts[i]], [images[i]] if images else None)
                    ((answers[i], generated),) = self._run_generate(single)
                    tokens[i] = (int(lengths[i]), generated)
                except Exception as e:  # noqa: BLE001 - this row alone fails: reject it with the error
                    reasons[i] = f"{type(e).__name__}: {e}"

    def _run_generate(self, inputs) -> list[tuple[str, int]]:
        """Each row's answer, and the tokens generated for it (up to and including its end token)."""
        import torch

        if self.seed is not None:
            torch.manual_seed(int(self.seed))
        inputs = inputs.to(self.device)
        with torch.inference_mode():
            out = self.model.generate(**inputs, pad_token_id=self.tokenizer.pad_token_id, **self.generate_kwargs)
        new = out[:, inputs["input_ids"].shape[1] :]
        texts = [t.strip() for t in self.tokenizer.batch_decode(new, skip_special_tokens=True)]
        return list(zip(texts, [self._generated(ids) for ids in new.tolist()], strict=True))

    def _generated(self, ids: list[int]) -> int:
        """Tokens generated: up to the first end token, which counts (padding after it does not)."""
        return next((i + 1 for i, token in enumerate(ids) if token in self.eos_ids), len(ids))

    def _choose(self, texts: list[str], answers: list, reasons: list, tokens: list) -> None:
        """Answer each row with its most likely choice (sum of the choice's token log-probabilities)."""
        prompts = [self.tokenizer(t, add_special_tokens=False).input_ids for t in texts]
        longest = max(len(c) for c in self.choice_ids)
        sequences = []  # (row, choice, prompt length, token ids)
        for row, ids in enumerate(prompts):
            reasons[row] = self._too_long(len(ids), longest, "the longest choice")
            if reasons[row] is None:
                sequences += [(row, c, len(ids), ids + cids) for c, cids in enumerate(self.choice_ids)]
        import numpy as np

        scores = np.full((len(texts), len(self.choice_ids)), -np.inf)
        for start in range(0, len(sequences), SCORE_BATCH):
            chunk = sequences[start : start + SCORE_BATCH]
            for (row, choice, _, _), score in zip(chunk, self._score(chunk), strict=True):
                scores[row, choice] = score
        for row in range(len(texts)):
            if reasons[row] is None:
                best = int(np.argmax(scores[row]))
                answers[row], tokens[row] = self.task.choices[best], (len(prompts[row]), len(self.choice_ids[best]))

    def _score(self, chunk: list[tuple[int, int, int, list[int]]]) -> list[float]:
        import torch

        width = max(len(seq) for *_, seq in chunk)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        attention = torch.zeros((len(chunk), width), dtype=torch.long)
        targets = torch.full((len(chunk), width), -100, dtype=torch.long)
        for j, (_, _, prompt_len, seq) in enumerate(chunk):
            input_ids[j, : len(seq)] = torch.tensor(seq)
            attention[j, : len(seq)] = 1
            targets[j, prompt_len : len(seq)] = torch.tensor(seq[prompt_len:])
        with torch.inference_mode():
            logits = self.model(
                input_ids=input_ids.to(self.device), attention_mask=attention.to(self.device)
            ).logits.float()
        logprobs = torch.log_softmax(logits[:, :-1], dim=-1)
        labels = targets[:, 1:].to(self.device)
        picked = logprobs.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        return (picked * (labels != -100)).sum(dim=1).tolist()


def _py(value: Any) -> Any:
    import numpy as np

    return value.item() if isinstance(value, np.generic) else value
