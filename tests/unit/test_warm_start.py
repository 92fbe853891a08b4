"""The warm start's parts without an environment: demonstration states → SFT samples (ordinary
and privileged twins, blind task lines), behaviour cloning raising the expert answer's
log-prob, the guidance-gap summary, the config's cache key, and the cache's refusal to load a
half-built folder."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from env_client.a11y import to_xml
from serve_apps.prompting.styles import Screen
from workflows.warm_start.bc import contexts, sft_rows, split_demos
from workflows.warm_start.build import MEMBERS, MODEL_FILES, STAMP, problems, warm_member
from workflows.warm_start.check import gap_summary
from workflows.warm_start.config import BCConfig, WarmStartConfig, warm_model_spec
from workflows.warm_start.demos import Demo

SIZE = (160, 210)


def _png(shade: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", SIZE, (shade, 255 - shade, 128)).save(buf, format="PNG")
    return buf.getvalue()


def _demo(i: int, target: int) -> Demo:
    names = ["OK", "Cancel", "Submit", "Next"]
    nodes = [
        {"role": "button", "name": n, "box": (10 + 35 * k, 100, 30, 20)}
        for k, n in enumerate(names)
    ]
    return Demo(
        episode=f"click-button/{i}/expert", task="click-button",
        instruction=f'Click on the "{names[target]}" button.',
        screen=Screen(_png(i * 40 % 255), to_xml(nodes, *SIZE)), history=[],
        answer=f"click {target}", guide=f"click {target} (button '{names[target]}')",
        avoid=f"click {(target + 1) % 4} (button '{names[(target + 1) % 4]}')",
    )  # fmt: skip


@pytest.fixture(scope="module")
def warm_init(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from workflows.common.tiny_models import build_tiny_checkpoint

    spec = warm_model_spec(0).model_copy(update={"hidden_size": 64, "num_layers": 1,
                                                 "intermediate_size": 128})  # fmt: skip
    return build_tiny_checkpoint(tmp_path_factory.mktemp("warm") / "init", spec)


def test_rows_have_ordinary_and_privileged_twins_with_the_same_target(warm_init: Path) -> None:
    from serve_apps.prompting.inputs import PromptEncoder

    encoder = PromptEncoder.from_pretrained(warm_init)
    demos = [_demo(i, i % 4) for i in range(6)]
    cfg = BCConfig(privileged_frac=1.0, blind_frac=1.0, follow_frac=0.0)
    rows = sft_rows(demos, cfg, encoder, {"click-button": "Click the button."}, seed=0)
    assert len(rows) == 12 and {r["source"] for r in rows} == {"bc", "bc-privileged"}
    by_state: dict[str, list[dict]] = {}
    for r in rows:
        by_state.setdefault(r["sample_id"].rsplit("/", 1)[0], []).append(r)
    for pair in by_state.values():
        ordinary, privileged = sorted(pair, key=lambda r: r["source"])
        assert ordinary["target_ids"] == privileged["target_ids"]
        assert len(privileged["prompt_ids"]) > len(ordinary["prompt_ids"])
    text = encoder.tokenizer.decode(rows[0]["target_ids"])
    assert text.startswith("click ") and text.endswith("<|im_end|>")
    # blind twins: the generic task line; the guidance names the element
    _, privileged = contexts(demos[0], "Click the button.")
    body = "".join(p.get("text", "") for p in privileged[1]["content"])
    assert "Task: Click the button." in body and "click 0 (button 'OK')" in body


def test_follow_twins_target_the_element_their_guidance_names(warm_init: Path) -> None:
    from serve_apps.prompting.inputs import PromptEncoder

    encoder = PromptEncoder.from_pretrained(warm_init)
    demos = [_demo(i, 0) for i in range(8)]
    cfg = BCConfig(privileged_frac=0.0, follow_frac=1.0)
    rows = sft_rows(demos, cfg, encoder, {"click-button": "Click the button."}, seed=1)
    follow = [r for r in rows if r["source"] == "bc-follow"]
    assert len(follow) == 8
    targets = {encoder.tokenizer.decode(r["target_ids"]) for r in follow}
    assert len(targets) > 1  # not the expert's answer (always "click 0" here): the guidance's
    for r in follow:
        prompt = encoder.tokenizer.decode(r["prompt_ids"])
        answer = encoder.tokenizer.decode(r["target_ids"]).removesuffix("<|im_end|>")
        assert f"[GUIDE]\n{answer} (button" in prompt and "Task: Click the button." in prompt
    # no generic task line known: no follow twin (the instruction would name the expert's)
    assert not [r for r in sft_rows(demos, cfg, encoder, {}, 0) if r["source"] == "bc-follow"]


def test_behaviour_cloning_raises_the_expert_answer_on_a_handful_of_samples(
    warm_init: Path,
) -> None:
    from transformers import AutoModelForImageTextToText

    from serve_apps.prompting.inputs import PromptEncoder
    from train_loops.batching import ImageEncoder
    from train_loops.objectives import SFTObjective

    torch.manual_seed(0)
    encoder = PromptEncoder.from_pretrained(warm_init)
    rows = sft_rows([_demo(i, i % 2) for i in range(4)], BCConfig(privileged_frac=0.0,
                    follow_frac=0.0), encoder, {}, seed=0)  # fmt: skip
    model = AutoModelForImageTextToText.from_pretrained(str(warm_init)).train()
    objective = SFTObjective(ImageEncoder.from_pretrained(str(warm_init)))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(25):
        opt.zero_grad()
        step = objective.micro_step(model, rows)
        step.loss.backward()
        opt.step()
        losses.append(float(step.metrics["loss/sft"]))
    assert losses[-1] < 0.5 * losses[0], losses


def test_demos_split_by_whole_episode() -> None:
    demos = [_demo(i, 0) for i in range(40)]
    train, held = split_demos(demos, 0.25)
    assert len(train) + len(held) == 40 and held
    assert not {d.episode for d in train} & {d.episode for d in held}
    assert split_demos(demos, 0.25)[1] == held  # stable, not order-dependent


def test_gap_summary() -> None:
    s = gap_summary([0.0, 2.0, 4.0, 6.0])
    assert s["n"] == 4 and s["mean"] == 3.0 and s["frac_above_1nat"] == 0.75
    assert gap_summary([]) == {"n": 0}


def test_cache_key_ignores_where_it_runs_but_not_what_is_built(tmp_path: Path) -> None:
    a = WarmStartConfig(cache_dir=str(tmp_path))
    assert a.digest() == WarmStartConfig(cache_dir="/elsewhere").digest()
    assert (
        a.digest()
        == a.model_copy(update={"ray": a.ray.model_copy(update={"num_cpus": 2})}).digest()
    )
    assert a.digest() != WarmStartConfig(seed=1).digest()
    assert a.digest() != a.model_copy(update={"bc": BCConfig(steps=7)}).digest()
    compact = a.analyzer.model_copy(update={"prompt_style": "compact"})
    assert a.digest() != a.model_copy(update={"analyzer": compact}).digest()
    rl_only = a.bc.trainer.model_copy(update={"updates_per_batch": 3})  # SFT never reads it
    bc = a.bc.model_copy(update={"trainer": rl_only})
    assert a.digest() == a.model_copy(update={"bc": bc}).digest()
    assert a.folder.parent == tmp_path and a.folder.name.startswith("warm-0-")


def test_incomplete_cache_is_named_and_never_loaded(tmp_path: Path) -> None:
    folder = tmp_path / "warm-0-x"
    for member in MEMBERS:
        (folder / member).mkdir(parents=True)
        for name in MODEL_FILES:
            (folder / member / name).write_text("{}")
    (folder / STAMP).write_text(json.dumps({"digest": "x"}))
    assert problems(folder) == []
    (folder / "analyzer" / "model.safetensors").unlink()
    assert problems(folder) == ["analyzer/model.safetensors"]
    (folder / STAMP).write_text("{not json")
    (folder / "analyzer" / "model.safetensors").write_text("{}")
    assert problems(folder)[0].startswith("unreadable metadata")
    with pytest.raises(ValueError, match="warm:<seed>"):
        warm_member("warm:abc", "policy")
    with pytest.raises(ValueError, match="member"):
        warm_member("warm:0", "critic")


def _fake_build(cfg: WarmStartConfig, work: Path, t0: float) -> dict:
    for member in MEMBERS:
        (work / member).mkdir()
        for name in MODEL_FILES:
            (work / member / name).write_text("{}")
    return {"fake": True}


def test_broken_cache_is_set_aside_and_rebuilt(tmp_path: Path, monkeypatch) -> None:
    from workflows.warm_start import build

    cfg = WarmStartConfig(cache_dir=str(tmp_path))
    cfg.folder.mkdir(parents=True)
    (cfg.folder / "policy").mkdir()  # a folder someone half-deleted
    monkeypatch.setattr(build, "_build_into", _fake_build)
    assert build.warm_start(cfg) == cfg.folder and problems(cfg.folder) == []
    assert len(list(tmp_path.glob("warm-0-*.broken-*"))) == 1
    stamp = json.loads((cfg.folder / STAMP).read_text())
    assert stamp["digest"] == cfg.digest()
    # a build that dies leaves nothing under the cache name
    monkeypatch.setattr(build, "_build_into", lambda *a: 1 / 0)
    other = WarmStartConfig(cache_dir=str(tmp_path), seed=3)
    with pytest.raises(ZeroDivisionError):
        build.warm_start(other)
    assert not other.folder.exists()


def test_folders_of_builds_whose_process_died_are_removed(tmp_path: Path, monkeypatch) -> None:
    import os
    import subprocess

    from workflows.warm_start import build

    cfg = WarmStartConfig(cache_dir=str(tmp_path))
    dead = subprocess.Popen(["true"])  # a process that has exited: its pid is free
    dead.wait()
    stale = cfg.folder.with_name(f"{cfg.folder.name}.building-{dead.pid}")
    alive = cfg.folder.with_name(f"{cfg.folder.name}.building-{os.getppid()}")
    for folder in (stale, alive):
        (folder / "policy").mkdir(parents=True)
    monkeypatch.setattr(build, "_build_into", _fake_build)
    assert build.warm_start(cfg) == cfg.folder
    assert not stale.exists()  # killed mid-build: it could never finish
    assert alive.exists()  # another process still building: left alone
