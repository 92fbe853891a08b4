"""Analyzer SFT pieces: the episode split, SFT samples identical to the deployment's prompt,
the step budget and the agreement report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from serve_apps.prompting.inputs import END_OF_TURN
from tests.unit._pipeline_helpers import click_action, click_button_truth, transition
from workflows.analyzer.experts import judgment_json
from workflows.analyzer.train import (
    Labeled,
    SampleBuilder,
    agreement,
    planned_steps,
    report_markdown,
    split_by_episode,
    transition_request,
)
from workflows.common.pipeline_config import PipelineConfig


def labeled(tid: str, episode: str, c: int, e: int, source: str = "policy") -> Labeled:
    row = transition(
        tid, click_button_truth(), click_button_truth(done=True, score=float(e)),
        click_action(24, 73, 'Click the "okay" button.'), episode=episode, source=source,
    )  # fmt: skip
    d = 1 if c and e else -1
    note = {"consistency": c, "effectiveness": e, "d": d, "text": judgment_json(c, e, "g", "a")}
    return Labeled(row, note)


def test_split_keeps_episodes_whole_and_both_sides_non_empty() -> None:
    data = [labeled(f"e{i}-s{j}", f"e{i}", 1, 1) for i in range(10) for j in range(3)]
    train, held = split_by_episode(data, 0.2, seed=0)
    assert len(held) == 6 and len(train) == 24
    assert not {d.episode_id for d in train} & {d.episode_id for d in held}
    assert split_by_episode(data, 0.2, seed=0) == (train, held)  # deterministic
    tiny = [labeled("a", "e0", 1, 1), labeled("b", "e1", 1, 1)]
    assert [len(x) for x in split_by_episode(tiny, 0.01, 0)] == [1, 1]
    assert split_by_episode(tiny, 0.0, 0)[1] == []


def test_planned_steps_from_epochs_or_explicit() -> None:
    cfg = PipelineConfig()
    assert planned_steps(cfg, 100) == 38  # 3 epochs of 100 samples at 8 per step, rounded up
    explicit = cfg.model_copy(update={"train": cfg.train.model_copy(update={"max_steps": 7})})
    assert planned_steps(explicit, 100) == 7


def test_agreement_counts_unparsed_answers_as_wrong() -> None:
    train = [labeled("t0", "a", 1, 1), labeled("t1", "b", 0, 0), labeled("t2", "c", 0, 0)]
    held = [labeled("h0", "x", 1, 1, "expert"), labeled("h1", "y", 0, 0), labeled("h2", "z", 1, 0)]
    preds: list[dict[str, Any]] = [
        {"consistency": 1, "effectiveness": 1, "d": 1},
        {"consistency": None, "effectiveness": 0, "d": 0},  # unparsed consistency
        {"consistency": 1, "effectiveness": 1, "d": 1},
    ]
    rep = agreement(held, preds, train)
    assert rep["accuracy"] == pytest.approx(
        {"consistency": 2 / 3, "effectiveness": 2 / 3, "d": 1 / 3}
    )
    assert rep["parsed"] == pytest.approx(2 / 3)
    # majority of train: consistency 0, effectiveness 0, d -1
    assert rep["baseline_majority"] == pytest.approx(
        {"consistency": 1 / 3, "effectiveness": 2 / 3, "d": 2 / 3}
    )
    assert rep["by_source"]["expert"] == {"n": 1, "consistency": 1, "effectiveness": 1, "d": 1}
    assert rep["confusion_d"] == {"-1": {"0": 1, "1": 1}, "1": {"1": 1}}
    text = report_markdown({"agreement": rep, "analyzer": "x", "num_train": 3})
    assert "| d | 33.3% | 66.7% |" in text


@pytest.mark.parametrize("style", ["compact", "minimal"])
def test_sft_sample_is_the_deployments_prompt_plus_answer(
    tiny_policy_path: Path, style: str
) -> None:
    from serve_apps.api import Transition
    from serve_apps.prompting.analyzer import analyzer_messages, minimal_analyzer_messages
    from serve_apps.prompting.inputs import PromptEncoder
    from train_loops.batching import ImageEncoder, collate_sft

    item = labeled("t", "e", 1, 1)
    builder = SampleBuilder(str(tiny_policy_path), full_prompt=False, prompt_style=style)
    row = builder.row(item)
    # What serve_apps.analyzer.AnalyzerServer does with the same transition:
    t = Transition.model_validate(transition_request(item.transition))
    args = (t.instruction, t.history, t.screenshot_before, t.response, t.action)
    messages, images = (
        analyzer_messages(*args, t.screenshot_after, full=False)
        if style == "compact"
        else minimal_analyzer_messages(*args, t.screenshot_after)
    )
    encoder = PromptEncoder.from_pretrained(tiny_policy_path)
    assert row["prompt_ids"] == encoder.encode(messages, encoder.load_images(images)).prompt_ids
    if style == "minimal":  # the point of it: far fewer tokens to train on
        compact = SampleBuilder(str(tiny_policy_path), full_prompt=False).row(item)
        assert len(row["prompt_ids"]) < 0.7 * len(compact["prompt_ids"])
    tok = encoder.tokenizer
    assert row["target_ids"][-1] == tok.convert_tokens_to_ids(END_OF_TURN)
    assert tok.decode(row["target_ids"][:-1]) == item.annotation["text"]
    batch = collate_sft([row], ImageEncoder.from_pretrained(str(tiny_policy_path)))
    assert batch.num_tokens == len(row["target_ids"])


def test_verdict_weight_lands_on_the_two_verdict_digits(tiny_policy_path: Path) -> None:
    item = labeled("t", "e", 1, 0)
    plain = SampleBuilder(str(tiny_policy_path), full_prompt=False).row(item)
    assert "target_weights" not in plain  # weight 1: rows as before
    row = SampleBuilder(str(tiny_policy_path), full_prompt=False, verdict_weight=8.0).row(item)
    assert row["target_ids"] == plain["target_ids"]
    from serve_apps.prompting.inputs import PromptEncoder

    tok = PromptEncoder.from_pretrained(tiny_policy_path).tokenizer
    heavy = [tok.decode([t]) for t, w in zip(row["target_ids"], row["target_weights"], strict=True)
             if w == 8.0]  # fmt: skip
    assert "".join(heavy).replace(" ", "") == "10"  # consistency 1, effectiveness 0
    assert row["target_weights"].count(1.0) == len(row["target_ids"]) - len(heavy)


def test_pipeline_trains_only_prompts_without_history_screens(tiny_policy_path: Path) -> None:
    from serve_apps.config import AnalyzerAppConfig

    with pytest.raises(ValueError, match=r"analyzer\.prompt_style='reference'"):
        PipelineConfig(analyzer=AnalyzerAppConfig(model_path="auto", prompt_style="reference"))
    with pytest.raises(ValueError, match="prompt_style='reference'"):
        SampleBuilder(str(tiny_policy_path), full_prompt=False, prompt_style="reference")
