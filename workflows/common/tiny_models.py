"""Build tiny Qwen3-VL-architecture checkpoints offline (random weights, locally trained tokenizer).

The result is an ordinary Hugging Face folder (config, safetensors, tokenizer, processor, chat
template), loaded by the same ``from_pretrained(path)`` calls that load a real Qwen3-VL-8B
checkpoint, so every code path above it is the production one. Deterministic from a seed and
cached on disk: a second call with the same spec returns the existing folder in milliseconds.

    python -m workflows.common.tiny_models --out ~/.cache/computersd/tiny-policy --seed 0
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

TINY_PREFIX = "tiny:"


def is_tiny(model_path: str) -> bool:
    """``tiny:<seed>`` in a model_path asks the job to build (once, cached) a tiny Qwen3-VL."""
    return model_path.startswith(TINY_PREFIX)


# Qwen2/Qwen3 special tokens, in Qwen's order, so ids of the tiny vocabulary line up by name
# with the real ones (the config's image/vision ids are set from this tokenizer).
QWEN_SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
# Not "special" in Qwen's tokenizer (they stay in decoded text) but single tokens.
QWEN_ADDED_TOKENS = ["<tool_call>", "</tool_call>", "<think>", "</think>"]

# Qwen2's pre-tokenizer: digits one by one, words with a leading space, punctuation runs.
QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# The Qwen3-VL chat template's conventions (im_start/im_end turns, images as
# vision_start + image_pad + vision_end, tool calls as plain text), trimmed to what we use.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class TinyModelSpec(BaseModel):
    """Shape of a tiny Qwen3-VL checkpoint. Defaults: ~1.5M parameters, ~35 image tokens per
    160x210 MiniWoB screenshot."""

    model_config = ConfigDict(extra="forbid")

    seed: int = Field(
        0, description="Seed for the random weights (the tokenizer is seed-independent)."
    )
    vocab_size: int = Field(1024, ge=300, le=65536, description="BPE vocabulary incl. specials.")
    hidden_size: int = Field(128, ge=32, description="Text model width.")
    num_layers: int = Field(2, ge=1, description="Text decoder layers.")
    num_heads: int = Field(4, ge=1, description="Attention heads (head_dim = hidden/heads).")
    num_kv_heads: int = Field(2, ge=1, description="Key/value heads (GQA).")
    intermediate_size: int = Field(256, ge=16, description="Text MLP width.")
    vision_hidden_size: int = Field(64, ge=16, description="Vision tower width.")
    vision_depth: int = Field(2, ge=1, description="Vision tower blocks.")
    min_pixels: int = Field(32 * 32, ge=32 * 32, description="Processor's smallest image area.")
    max_pixels: int = Field(256 * 256, ge=32 * 32, description="Processor's largest image area.")
    corpus: Literal["toolcall", "elements"] = Field(
        "toolcall",
        description="Tokenizer training text: tool-call answers and analyzer JSON; 'elements' "
        "adds the elements prompt style's lines (serve_apps.prompting.elements), so element "
        "listings and short answers take few tokens.",
    )

    def digest(self) -> str:
        blob = json.dumps(self.model_dump(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


def default_cache_dir() -> Path:
    return Path(os.environ.get("CSD_CACHE", Path.home() / ".cache" / "computersd"))


def _tokenizer_corpus() -> list[str]:
    """Text in the shapes our models read and write: instructions, actions, analyzer JSON.
    Fixed (not seeded) so every tiny model shares one tokenizer, as a policy and the analyzer
    initialized from it must."""
    import random

    rng = random.Random(1234)
    words = [
        "click",
        "the",
        "button",
        "OK",
        "Cancel",
        "submit",
        "link",
        "tab",
        "checkbox",
        "select",
        "enter",
        "type",
        "text",
        "field",
        "dialog",
        "close",
        "press",
        "key",
        "scroll",
        "left",
        "right",
        "up",
        "down",
        "double",
        "drag",
        "move",
        "wait",
        "done",
        "fail",
        "success",
        "failure",
        "screen",
        "screenshot",
        "task",
        "instruction",
        "action",
        "history",
        "step",
        "previous",
        "consistency",
        "effectiveness",
        "guide",
        "avoid",
        "element",
        "target",
        "focus",
        "input",
        "search",
        "menu",
        "item",
        "yes",
        "no",
        "next",
        "back",
        "open",
        "save",
        "the",
        "a",
        "an",
        "on",
        "in",
        "to",
        "of",
        "and",
        "or",
        "with",
        "is",
        "was",
        "it",
        "this",
        "that",
    ]
    actions = [
        "left_click",
        "double_click",
        "right_click",
        "type",
        "key",
        "scroll",
        "mouse_move",
        "left_click_drag",
        "triple_click",
        "wait",
        "terminate",
    ]
    corpus = []
    for _ in range(3000):
        phrase = " ".join(rng.choice(words) for _ in range(rng.randint(3, 12)))
        x, y = rng.randint(0, 999), rng.randint(0, 999)
        act = rng.choice(actions)
        corpus.append(f"Action: {phrase}.")
        call = {"name": "computer_use", "arguments": {"action": act, "coordinate": [x, y]}}
        corpus.append(json.dumps(call))
        judgment = {"consistency": rng.randint(0, 1), "effectiveness": rng.randint(0, 1),
                    "guide": phrase, "avoid": phrase[::-1]}  # fmt: skip
        corpus.append(json.dumps(judgment))
        corpus.append(f'Click on the "{rng.choice(words)}" {rng.choice(words)}. Type {phrase}!')
    return corpus


def _elements_corpus() -> list[str]:
    """Prompts, answers and judgments of the elements style, on MiniWoB-like words. Fixed, so
    a warm-start policy and the analyzer initialized from it share the tokenizer."""
    import random

    from env_client.tasks import load_task_list

    rng = random.Random(4321)
    roles = ["text", "button", "link", "textbox", "checkbox", "radio", "tab", "combobox"]
    words = sorted({w.strip(".,'\"") for t in load_task_list().tasks.values()
                    for w in t.description.split()} | {"OK", "Cancel", "Submit", "Yes", "No"})  # fmt: skip
    corpus = []
    for _ in range(2000):
        lines = ["Task: " + " ".join(rng.choice(words) for _ in range(rng.randint(3, 9))),
                 "Elements:"]  # fmt: skip
        for i in range(rng.randint(2, 10)):
            name = " ".join(rng.choice(words) for _ in range(rng.randint(0, 3)))
            flag = rng.choice(["", " focused", " checked", " unchecked", ' value="abc"'])
            lines.append(f'{i} {rng.choice(roles)} "{name}" {rng.randint(0, 999)} '
                         f"{rng.randint(0, 999)}{flag}")  # fmt: skip
        answer = rng.choice([f"click {rng.randint(0, 12)}", f'type "{rng.choice(words)}"',
                             "key enter"])  # fmt: skip
        lines += [f"Previous: {answer}; click {rng.choice(roles)} '{rng.choice(words)}'", "Screen:"]
        corpus += ["\n".join(lines), answer]
        guide = f"click {rng.randint(0, 12)} ({rng.choice(roles)} '{rng.choice(words)}')"
        judgment = {"consistency": rng.randint(0, 1), "effectiveness": rng.randint(0, 1),
                    "guide": guide, "avoid": guide[::-1]}  # fmt: skip
        corpus.append(json.dumps(judgment))
    return corpus


def build_tokenizer(spec: TinyModelSpec):  # -> transformers.Qwen2Tokenizer
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    bpe = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    n_extra = len(QWEN_SPECIAL_TOKENS) + len(QWEN_ADDED_TOKENS)
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size - n_extra,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = _tokenizer_corpus()
    if spec.corpus == "elements":
        corpus += _elements_corpus()
    bpe.train_from_iterator(corpus, trainer=trainer)
    tok = Qwen2Tokenizer(tokenizer_object=bpe, errors="replace")
    tok.add_special_tokens({"additional_special_tokens": QWEN_SPECIAL_TOKENS})
    tok.add_tokens(QWEN_ADDED_TOKENS)
    tok.eos_token = "<|im_end|>"
    tok.pad_token = "<|endoftext|>"
    tok.chat_template = CHAT_TEMPLATE
    return tok


def _model_config(spec: TinyModelSpec, tok):  # -> Qwen3VLConfig
    from transformers import Qwen3VLConfig

    head_dim = spec.hidden_size // spec.num_heads
    half = head_dim // 2
    # M-RoPE splits the rotary half-dim over (t, h, w); real 8B: [24, 20, 20] of 64.
    t = half - 2 * (half * 5 // 16)
    mrope = [t, half * 5 // 16, half * 5 // 16]
    ids = {name: tok.convert_tokens_to_ids(name) for name in QWEN_SPECIAL_TOKENS}
    return Qwen3VLConfig(
        text_config={
            # Padded to the spec's size like Qwen's 151936 > len(tokenizer): shapes stay fixed.
            "vocab_size": spec.vocab_size,
            "hidden_size": spec.hidden_size,
            "intermediate_size": spec.intermediate_size,
            "num_hidden_layers": spec.num_layers,
            "num_attention_heads": spec.num_heads,
            "num_key_value_heads": spec.num_kv_heads,
            "head_dim": head_dim,
            "max_position_embeddings": 8192,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 5_000_000.0,
                "mrope_section": mrope,
                "mrope_interleaved": True,
            },
            "pad_token_id": ids["<|endoftext|>"],
        },
        vision_config={
            "depth": spec.vision_depth,
            "hidden_size": spec.vision_hidden_size,
            "intermediate_size": spec.vision_hidden_size * 2,
            "num_heads": max(1, spec.vision_hidden_size // 32),
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": spec.hidden_size,
            "num_position_embeddings": 576,
            "deepstack_visual_indexes": [spec.vision_depth - 1],
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )


def _processor(spec: TinyModelSpec, tok):  # -> Qwen3VLProcessor
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    size = {"shortest_edge": spec.min_pixels, "longest_edge": spec.max_pixels}
    image = Qwen2VLImageProcessor(size=size, patch_size=16, merge_size=2, temporal_patch_size=2)
    video = Qwen3VLVideoProcessor(size=size, patch_size=16, merge_size=2, temporal_patch_size=2)
    return Qwen3VLProcessor(
        image_processor=image, tokenizer=tok, video_processor=video, chat_template=CHAT_TEMPLATE
    )


def build_tiny_checkpoint(out_dir: str | Path, spec: TinyModelSpec | None = None) -> Path:
    """Write a tiny checkpoint to ``out_dir`` (unless the same spec is already there)."""
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    spec = spec or TinyModelSpec()
    out = Path(out_dir).expanduser()
    stamp = out / "tiny_spec.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("digest") == spec.digest():
        return out
    tok = build_tokenizer(spec)
    if len(tok) > spec.vocab_size:
        raise ValueError(f"tokenizer has {len(tok)} tokens > vocab_size={spec.vocab_size}")
    torch.manual_seed(spec.seed)
    model = Qwen3VLForConditionalGeneration(_model_config(spec, tok))
    model.generation_config.eos_token_id = [tok.convert_tokens_to_ids("<|im_end|>")]
    model.generation_config.pad_token_id = tok.pad_token_id
    # Write to a sibling temp folder and rename, so a crash never leaves a half checkpoint.
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    model.save_pretrained(tmp)
    _processor(spec, tok).save_pretrained(tmp)
    (tmp / "tiny_spec.json").write_text(
        json.dumps({"digest": spec.digest(), "spec": spec.model_dump()}, indent=2)
    )
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def tiny_checkpoint(name: str, spec: TinyModelSpec | None = None) -> Path:
    """Cached tiny checkpoint ``name`` under the cache dir (``$CSD_CACHE`` or ~/.cache)."""
    spec = spec or TinyModelSpec()
    return build_tiny_checkpoint(default_cache_dir() / f"tiny-{name}-{spec.digest()}", spec)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output folder (Hugging Face format)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    path = build_tiny_checkpoint(args.out, TinyModelSpec(seed=args.seed))
    print(f"tiny Qwen3-VL checkpoint at {path}")


if __name__ == "__main__":
    main()
