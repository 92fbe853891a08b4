"""Tiny Qwen3-VL checkpoints: offline build, save → reload through from_pretrained, determinism."""

from __future__ import annotations

from pathlib import Path

import pytest

from workflows.common.tiny_models import (
    QWEN_ADDED_TOKENS,
    QWEN_SPECIAL_TOKENS,
    TinyModelSpec,
    build_tiny_checkpoint,
)


def _screens():
    from PIL import Image

    return [
        Image.new("RGB", (160, 210), (250, 250, 250)),
        Image.new("RGB", (160, 210), (10, 90, 200)),
    ]


def _generate(path: Path, max_new_tokens: int = 12) -> list[int]:
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    proc = AutoProcessor.from_pretrained(path)
    model = AutoModelForImageTextToText.from_pretrained(path).eval()
    msgs = [
        {"role": "user", "content": [{"type": "text", "text": "Click OK"}, {"type": "image"}]},
        {"role": "assistant", "content": "Action: click."},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "next"}]},
    ]
    text = proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    inputs = proc(text=[text], images=_screens(), return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, inputs["input_ids"].shape[1] :].tolist()


def test_build_save_reload_generates_identical_tokens(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForImageTextToText

    path = build_tiny_checkpoint(tmp_path / "a", TinyModelSpec(seed=3))
    model = AutoModelForImageTextToText.from_pretrained(path)
    resaved = tmp_path / "b"
    model.save_pretrained(resaved)
    for name in path.iterdir():  # processor + tokenizer files travel with the weights
        if not name.name.startswith("model") and name.name != "config.json":
            (resaved / name.name).write_bytes(name.read_bytes())
    first = _generate(path)
    assert len(first) > 0
    assert first == _generate(resaved)
    reloaded = AutoModelForImageTextToText.from_pretrained(resaved)
    for (k, a), (_, b) in zip(
        model.state_dict().items(), reloaded.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), k


def test_same_seed_same_weights_other_seed_differs(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    a = build_tiny_checkpoint(tmp_path / "a", TinyModelSpec(seed=1))
    b = build_tiny_checkpoint(tmp_path / "b", TinyModelSpec(seed=1))
    c = build_tiny_checkpoint(tmp_path / "c", TinyModelSpec(seed=2))
    wa, wb, wc = (load_file(p / "model.safetensors") for p in (a, b, c))
    assert all((wa[k] == wb[k]).all() for k in wa)
    assert any(not (wa[k] == wc[k]).all() for k in wa)
    assert (a / "tokenizer.json").read_text() == (b / "tokenizer.json").read_text()


def test_cached_build_returns_existing_folder(tmp_path: Path) -> None:
    path = build_tiny_checkpoint(tmp_path / "m", TinyModelSpec())
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_checkpoint(tmp_path / "m", TinyModelSpec()) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime


def test_tokenizer_has_qwen_conventions(tiny_policy_path: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_policy_path)
    cfg = AutoConfig.from_pretrained(tiny_policy_path)
    for name in QWEN_SPECIAL_TOKENS + QWEN_ADDED_TOKENS:
        ids = tok.encode(name, add_special_tokens=False)
        assert len(ids) == 1, name
    assert cfg.image_token_id == tok.convert_tokens_to_ids("<|image_pad|>")
    assert cfg.vision_start_token_id == tok.convert_tokens_to_ids("<|vision_start|>")
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    call = '<tool_call>{"name": "computer_use", "arguments": {"coordinate": [512, 38]}}</tool_call>'
    assert tok.decode(tok.encode(call, add_special_tokens=False)) == call
    # Digits are single tokens, as in Qwen: coordinates cost one token per digit.
    assert tok.tokenize("512") == ["5", "1", "2"]


def test_spec_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        TinyModelSpec(vocab_size=10)
