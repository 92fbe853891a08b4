"""The analyzer pipeline end to end on real parts: embedded MiniWoB++ server (Chromium), the tiny
base policy as a Serve deployment, the oracle expert, SFT with Ray Train + DeepSpeed ZeRO-2 on
2 CPU workers, and the trained analyzer deployed as the RL job's analyzer app.

One scenario, small sizes: collect (base policy + scripted expert/wrong/mismatch episodes on two
tasks) → annotate (oracle) → train_analyzer (SFT, export, deploy, held-out agreement) → the
online RL config takes the result as ``analyzer.model_path``.
"""

from __future__ import annotations

import json
import socket
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import torch

from workflows.analyzer import annotate, collect
from workflows.analyzer import train as train_analyzer
from workflows.analyzer.transitions import read_transitions, validate_transition
from workflows.common.config_io import load_config
from workflows.common.pipeline_config import PipelineConfig
from workflows.online_rl.config import OnlineRLConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def env_server():
    from env_client.config import EmbeddedEnvConfig
    from env_client.server import start_embedded_server

    with start_embedded_server(EmbeddedEnvConfig(capacity=4, prewarm=2)) as server:
        yield server


def _config(tmp_path: Path, env_url: str) -> PipelineConfig:
    return load_config(
        PipelineConfig,
        "analyzer_pipeline",
        [
            f"runs_dir={tmp_path}", "run_name=chain", f"env.server_url={env_url}",
            f"serve_http_port={_free_port()}", "policy.num_cpus=0.25", "analyzer.num_cpus=0.25",
            "collect.tasks=[click-button, enter-text]", "collect.seeds_per_task=2",
            "collect.max_steps=3", "train.max_steps=6", "train.holdout_frac=0.25",
            "train.trainer.cpus_per_worker=0.5",
        ],
    )  # fmt: skip


def _load_weights(path: Path | str) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(str(path)).state_dict()


def test_collect_annotate_train_and_deploy_the_analyzer(
    tmp_path: Path, env_server, ray_cluster, tiny_policy_path: Path
) -> None:
    cfg = _config(tmp_path, env_server.url)

    # --- collect: every source played, every transition stored with its ground truth
    summary = collect.run(cfg)
    by_source = summary["by_source"]
    assert {s: c["episodes"] for s, c in by_source.items()} == dict.fromkeys(
        ("expert", "mismatch", "policy", "wrong"), 4
    )
    assert by_source["expert"]["success_rate"] == 1.0 == by_source["mismatch"]["success_rate"]
    assert by_source["wrong"]["success_rate"] == 0.0
    rows = read_transitions(cfg.run_dir / "transitions")
    scripted = 3 * (2 * 1 + 2 * 3)  # click-button: 1 step, enter-text: 3 steps; 2 instances each
    assert (
        len(rows)
        == summary["total"]["transitions"]
        == scripted + by_source["policy"]["transitions"]
    )
    assert len({r["transition_id"] for r in rows}) == len(rows)
    for r in rows:
        validate_transition(r)
        assert r["screenshot_before"].startswith(b"\x89PNG") and r["truth_before"]
        assert len(r["history"]) == r["step_index"]
        assert json.loads(r["truth_after"])["task"] == r["task_name"]

    again = collect.run(cfg)  # a rerun resumes: nothing stored is played again
    assert again["already_stored_episodes"] == 16 and again["total"] == {}
    assert len(read_transitions(cfg.run_dir / "transitions")) == len(rows)

    # --- annotate with the oracle: verdicts match what each source is
    ann = annotate.run(cfg)
    assert (ann["annotated_ok"], ann["rejected"], ann["unannotated"]) == (len(rows), 0, 0)
    verdicts = ann["verdicts_by_source"]
    assert verdicts["expert"] == {"c1e1": 8} and verdicts["mismatch"] == {"c0e1": 8}
    assert verdicts["wrong"].get("c0e0", 0) == verdicts["wrong"].get("c0e1", 0) == 0
    notes = annotate.read_annotations(cfg.run_dir / annotate.ANNOTATIONS_FILE)
    last_wrong = defaultdict(list)
    for r in rows:
        if r["source"] == "wrong":
            last_wrong[r["episode_id"]].append((r["step_index"], notes[r["transition_id"]]))
    assert all(max(steps)[1]["effectiveness"] == 0 for steps in last_wrong.values())
    policy_c = Counter(
        notes[r["transition_id"]]["consistency"] for r in rows if r["source"] == "policy"
    )
    invalid = sum(not r["executed"] for r in rows if r["source"] == "policy")
    assert policy_c[0] >= invalid  # an unparsed answer is never consistent

    # --- train: SFT from the base policy, exported, deployed, judged on held-out episodes
    report = train_analyzer.run(cfg)
    model = cfg.run_dir / train_analyzer.MODEL_DIR
    assert report["analyzer"] == str(model) and report["sft_steps"] == 6
    assert not (model / "deepspeed").exists() and (model / "analyzer_training.json").exists()
    agree = report["agreement"]
    assert agree["n"] == report["num_holdout"] > 0
    assert set(agree["accuracy"]) == {"consistency", "effectiveness", "d"}
    assert all(0.0 <= v <= 1.0 for v in agree["accuracy"].values())
    assert (cfg.run_dir / "analyzer_report.md").read_text().startswith("# Analyzer agreement")
    lines = (cfg.run_dir / train_analyzer.PREDICTIONS).read_text().splitlines()
    predicted = [json.loads(x) for x in lines]
    assert len(predicted) == agree["n"] and all(p["raw"] for p in predicted)
    hits = sum(p["d"] == p["label"]["d"] for p in predicted)
    assert hits == round(agree["accuracy"]["d"] * agree["n"])
    base, trained = _load_weights(tiny_policy_path), _load_weights(model)
    changed = [k for k in base if not torch.equal(base[k], trained[k])]
    assert len(changed) > len(base) // 2, f"only {len(changed)} tensors changed"
    events = [json.loads(x) for x in (cfg.run_dir / "train_events.jsonl").read_text().splitlines()]
    assert events[-1]["event"] == "end" and events[-1]["step"] == 6

    # --- the online RL job takes it as its analyzer
    rl = load_config(OnlineRLConfig, "embedded", [f"analyzer.model_path={model}"])
    assert Path(rl.analyzer.model_path) == model
    assert rl.analyzer.prompt_style == cfg.analyzer.prompt_style == "minimal"
    assert rl.analyzer.full_system_prompt == cfg.analyzer.full_system_prompt

    # --- the OpenAI-compatible expert against our own Serve endpoint (the trained analyzer)
    _annotate_through_our_openai_endpoint(cfg, model, rows[:4], tmp_path)


def _annotate_through_our_openai_endpoint(
    cfg: PipelineConfig, model: Path, rows: list[dict], tmp_path: Path
) -> None:
    """Real protocol interop: images as data URLs, answers parsed and validated. A 6-step
    tiny analyzer may well answer nonsense: what must hold is that every transition gets an
    answer (ok or rejected) and no request fails."""
    import asyncio

    from ray.serve.context import _get_global_client

    from serve_apps.analyzer import build_analyzer_app
    from workflows.analyzer.transitions import write_transitions
    from workflows.common.pipeline import serve_app
    from workflows.common.pipeline_config import AnnotateConfig, OpenAIExpertConfig

    name = "chain-openai"
    app_cfg = cfg.analyzer.model_copy(
        update={"model_path": str(model), "name": name, "route_prefix": f"/{name}"}
    )
    port = _get_global_client().http_config.port
    expert = OpenAIExpertConfig(
        base_url=f"http://127.0.0.1:{port}/{name}/v1", model=name, api_key_env=None,
        concurrency=2, max_tokens=160, full_system_prompt=cfg.analyzer.full_system_prompt,
    )  # fmt: skip
    other = cfg.model_copy(
        update={"runs_dir": str(tmp_path / "openai"), "annotate": AnnotateConfig(expert=expert)}
    )
    write_transitions(rows, other.run_dir / "transitions" / "part-0.parquet")
    with serve_app(build_analyzer_app(app_cfg), name, app_cfg.route_prefix):
        summary = asyncio.run(annotate.annotate(other))
    assert summary["this_run"].get("errors", 0) == 0, summary["errors"]
    assert summary["annotated_ok"] + summary["rejected"] == len(rows)
    assert summary["expert"]["requests"] >= len(rows)
