"""The prompt builder: message formats (pure) and model inputs through the real processor."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from PIL import Image

from serve_apps.api import ChatInput
from serve_apps.errors import RequestError
from serve_apps.prompting import (
    FULL_SYSTEM_PROMPT,
    PRIVILEGED_BLOCK,
    SHORT_SYSTEM_PROMPT,
    agent_messages,
    analyzer_messages,
    guidance_text,
    privileged_messages,
    summarize_response,
    system_prompt,
)
from serve_apps.prompting.inputs import ImageLimits, PromptEncoder


def png(
    size: tuple[int, int], color: tuple[int, int, int] = (200, 30, 30), fmt: str = "PNG"
) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, fmt)
    return buf.getvalue()


@pytest.fixture(scope="module")
def encoder(tiny_policy_path: Path) -> PromptEncoder:
    return PromptEncoder.from_pretrained(tiny_policy_path, ImageLimits(max_images=4))


# ---- message formats -------------------------------------------------------------------------


def test_agent_context_keeps_last_h_screens_and_history() -> None:
    shots = ["s0", "s1", "s2", "s3", "s4"]
    history = ["clicked OK", "typed 'abc'", "pressed enter", "scrolled down"]
    messages, images = agent_messages("Submit the form", shots, history)
    assert images == ["s2", "s3", "s4"]  # H=3, oldest first, last is current
    assert messages[0] == {"role": "system", "content": SHORT_SYSTEM_PROMPT}
    user = messages[1]
    assert user["role"] == "user"
    assert [p["type"] for p in user["content"]] == ["text", "image", "image", "image"]
    text = user["content"][0]["text"]
    assert text.startswith("Task: Submit the form\nPrevious actions:\n1. clicked OK\n")
    assert "4. scrolled down" in text and "last is the current screen" in text


def test_agent_context_first_step_and_elided_history() -> None:
    messages, images = agent_messages("Do it", [b"only"], [])
    assert images == [b"only"]
    assert "Previous actions: none" in messages[1]["content"][0]["text"]
    assert "Current screen:" in messages[1]["content"][0]["text"]
    messages, _ = agent_messages("Do it", [1], [f"a{i}" for i in range(10)], max_history_lines=3)
    text = messages[1]["content"][0]["text"]
    assert "(7 earlier actions omitted)" in text and "8. a7" in text and "1. a0" not in text
    with pytest.raises(ValueError, match="at least the current"):
        agent_messages("x", [], [])


def test_system_prompts_short_and_full() -> None:
    assert system_prompt() == SHORT_SYSTEM_PROMPT and system_prompt("full") == FULL_SYSTEM_PROMPT
    assert "0..999" in SHORT_SYSTEM_PROMPT and "computer_use" in SHORT_SYSTEM_PROMPT
    assert len(SHORT_SYSTEM_PROMPT) < len(FULL_SYSTEM_PROMPT) / 3
    messages, _ = agent_messages("x", [1], system=FULL_SYSTEM_PROMPT)
    assert messages[0]["content"] == FULL_SYSTEM_PROMPT
    with pytest.raises(ValueError, match="allowed"):
        system_prompt("medium")


def test_privileged_block_goes_to_the_last_user_message_only() -> None:
    guidance = guidance_text(" click OK ", "do not click Cancel")
    assert guidance == "[GUIDE]\nclick OK\n\n[AVOID]\ndo not click Cancel"
    ordinary, _ = agent_messages("Submit", [1, 2], ["a"])
    conversation = [
        *ordinary,
        {"role": "assistant", "content": "Action: x"},
        {"role": "user", "content": "next"},
    ]
    privileged = privileged_messages(conversation, guidance)
    block = "\n\n[PRIVILEGED_ACTION_GUIDANCE]\n" + guidance + "\n[/PRIVILEGED_ACTION_GUIDANCE]"
    assert block == PRIVILEGED_BLOCK.format(guidance=guidance)
    assert privileged[-1]["content"] == "next" + block
    assert privileged[:-1] == conversation[:-1]  # earlier messages untouched
    assert conversation[-1]["content"] == "next"  # input not modified
    single = privileged_messages(ordinary, guidance)
    assert single[1]["content"][-1] == {"type": "text", "text": block}
    assert single[1]["content"][:-1] == ordinary[1]["content"]  # images stay in place
    with pytest.raises(ValueError, match="no user message"):
        privileged_messages([{"role": "system", "content": "s"}], guidance)


def test_summarize_response() -> None:
    response = 'Action: click the "OK" button.\n<tool_call>{"name": "computer_use"}</tool_call>'
    assert summarize_response(response) == 'click the "OK" button.'
    assert summarize_response('<tool_call>{"a": 1}</tool_call>') == '{"a": 1}'
    assert summarize_response("") == "(no action)"
    assert len(summarize_response("Action: " + "x" * 500, max_chars=50)) == 50


def test_analyzer_prompt_has_both_screens_in_order() -> None:
    messages, images = analyzer_messages(
        "Submit", ["clicked a"], "BEFORE", "Action: click OK", '{"action": "left_click"}', "AFTER"
    )
    assert images == ["BEFORE", "AFTER"]
    parts = messages[1]["content"]
    assert [p["type"] for p in parts] == ["text", "image", "text", "image", "text"]
    assert "Screen before" in parts[0]["text"] and "Screen after" in parts[2]["text"]
    assert '"action": "left_click"' in parts[2]["text"] and "Action: click OK" in parts[2]["text"]
    assert '"consistency"' in messages[0]["content"]
    short, _ = analyzer_messages("t", [], 1, "r", "{}", 2, full=False)
    assert len(short[0]["content"]) < len(messages[0]["content"])


def test_chat_input_checks_image_count() -> None:
    messages, _ = agent_messages("x", [1, 2])
    ChatInput(messages=messages, images=[b"a", b"b"])
    with pytest.raises(ValueError, match="2 image parts but 1 images"):
        ChatInput(messages=messages, images=[b"a"])


# ---- model inputs through the checkpoint's processor -------------------------------------------


def test_two_screenshot_conversation_has_exact_image_pads(encoder: PromptEncoder) -> None:
    # Sizes are multiples of patch*merge=32 and within the processor's pixel bounds, so the
    # grid is (1, H/16, W/16): 224x160 -> (1, 14, 10), 192x256 -> (1, 12, 16).
    shots = [png((160, 224)), png((256, 192), (10, 200, 10))]
    messages, images = agent_messages("Click OK", shots, ["typed hello"])
    encoded = encoder.encode(messages, encoder.load_images(images))
    assert encoded.image_grid_thw.tolist() == [[1, 14, 10], [1, 12, 16]]
    merge = 2
    expected = 1 * 14 * 10 // merge**2 + 1 * 12 * 16 // merge**2  # 35 + 48
    ids = encoded.prompt_ids
    assert ids.count(encoder.image_token_id) == expected == 83
    assert encoder.image_pad_count(encoded.image_grid_thw) == expected
    assert encoded.mm_token_type_ids[0].tolist() == [int(t == encoder.image_token_id) for t in ids]
    assert encoded.attention_mask.sum().item() == len(ids) == encoded.num_tokens
    assert encoded.pixel_values.shape[0] == 14 * 10 + 12 * 16  # patches, before merging
    text = encoder.render(messages)
    assert text.count("<|image_pad|>") == 2 and text.endswith("<|im_start|>assistant\n")
    # The unexpanded template ids (what vLLM receives) differ only by the expansion.
    assert len(encoder.text_ids(messages)) == len(ids) - expected + 2


def test_short_system_prompt_is_cheap_on_cpu(encoder: PromptEncoder) -> None:
    n = len(encoder.tokenizer(SHORT_SYSTEM_PROMPT)["input_ids"])
    assert n < 100, n  # tokens of the tiny tokenizer (79 when written)
    assert len(encoder.tokenizer(FULL_SYSTEM_PROMPT)["input_ids"]) > 4 * n


def test_image_checks(encoder: PromptEncoder) -> None:
    good = png((64, 64))
    assert encoder.load_images([good, Image.new("L", (8, 8))])[1].mode == "RGB"
    with pytest.raises(RequestError, match="image 0: not a decodable image"):
        encoder.load_images([b"not an image"])
    with pytest.raises(RequestError, match="at most 4 allowed"):
        encoder.load_images([good] * 5)
    with pytest.raises(RequestError, match="format TIFF not accepted"):
        encoder.load_images([png((8, 8), fmt="TIFF")])
    small = PromptEncoder(encoder.processor, ImageLimits(max_bytes=2048, max_pixels=100 * 100))
    with pytest.raises(RequestError, match="pixels"):
        small.load_images([png((200, 200))])
    noisy = Image.frombytes("RGB", (64, 64), os.urandom(64 * 64 * 3))  # incompressible
    buf = io.BytesIO()
    noisy.save(buf, "PNG")
    with pytest.raises(RequestError, match="bytes, at most 2048"):
        small.load_images([buf.getvalue()])


def test_vision_tokens_are_known(encoder: PromptEncoder) -> None:
    assert encoder.image_token_id in encoder.vision_token_ids
    assert len(encoder.vision_token_ids) == 5
