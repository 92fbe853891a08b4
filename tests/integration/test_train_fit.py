"""The RL and SFT trainers for real: Ray Train TorchTrainer, 2 CPU workers, DeepSpeed ZeRO-2.

Three ``fit()`` calls share one module-scoped first run:

1. RL over an *endless* streaming dataset of real step samples from the tiny policy
   (3 steps): parameters change, the loss on that fixed batch goes down, checkpoints reload
   with ``from_pretrained``, the publisher sees versions 1, 2, 3 with the checkpointed weights;
2. RL resumed from that checkpoint over a bounded dataset that runs out after 2 steps:
   optimizer state restored, step and version continue (publisher sees 4, 5), the workers
   agree to stop at the end of the data and save a final checkpoint;
3. an SFT phase started from the RL checkpoint (Entropulse): weights and version carried over,
   optimizer fresh, SFT loss falls on its fixed batch, publisher sees 4, 5, 6.

The first DeepSpeed initialize on a machine compiles a comm op (~80-160 s, cached after).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import ray
import torch

from tests.integration._train_helpers import (
    RecordingPublisher,
    endless_dataset,
    new_publish_log,
    weights_digest,
)
from train_loops.config import LossConfig, OptimConfig, RLTrainConfig, SFTTrainConfig, cpu_trainer
from train_loops.metrics import EVENTS_FILE, METRICS_FILE
from train_loops.schema import to_sft_table, to_table

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

REQUIRED_RL_METRICS = (
    "loss/pg", "loss/sd", "loss/kl", "loss/total", "sd/gate_mean", "sd/frac_masked",
    "pg/clip_frac", "policy/entropy", "tokens", "step_time", "train/step", "train/version",
    "staleness/mean", "staleness/max",
)  # fmt: skip
LOSS = LossConfig(kl_coef=0.01, sd_coef=0.1)  # λ_SD raised so the SD term is visible
OPTIM = OptimConfig(lr=1e-3)  # large: a random tiny model must move in 3 steps


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _load(path: str | Path):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(str(path)).eval()


@pytest.fixture(scope="module")
def samples(tiny_policy_path: Path) -> list[dict[str, Any]]:
    from train_loops.sample_maker import make_step_samples

    return make_step_samples(str(tiny_policy_path), num_groups=2, group_size=4, max_new_tokens=12)


@pytest.fixture(scope="module")
def first_run(ray_cluster, tiny_policy_path, samples, tmp_path_factory) -> dict[str, Any]:
    from train_loops.trainers import build_rl_trainer

    run_dir = tmp_path_factory.mktemp("rl-run")
    log = new_publish_log()
    cfg = RLTrainConfig(
        trainer=cpu_trainer(
            samples_per_step=8, micro_batch_size=2, max_steps=3, checkpoint_every=2
        ),
        optim=OPTIM,
        loss=LOSS,
    )
    trainer = build_rl_trainer(
        cfg, tiny_policy_path, {"train": endless_dataset(to_table(samples))},
        RecordingPublisher(log), run_dir,
    )  # fmt: skip
    result = trainer.fit()
    return {
        "result": result,
        "run_dir": run_dir,
        "calls": ray.get(log.get_calls.remote()),
        "latest": ray.get(log.get_latest.remote()),
    }


def test_rl_run_reports_namespaced_metrics(first_run: dict[str, Any]) -> None:
    result = first_run["result"]
    assert result.error is None
    for key in REQUIRED_RL_METRICS:
        assert key in result.metrics, key
    steps = _jsonl(first_run["run_dir"] / METRICS_FILE)
    assert [s["train/step"] for s in steps] == [1, 2, 3]
    assert [s["train/version"] for s in steps] == [1, 2, 3]
    assert all(set(REQUIRED_RL_METRICS) <= set(s) for s in steps)
    assert all(s["tokens"] > 0 and s["samples"] == 8 for s in steps)
    # samples were made by version 0: staleness grows by one per step
    assert [s["staleness/max"] for s in steps] == [0.0, 1.0, 2.0]
    events = _jsonl(first_run["run_dir"] / EVENTS_FILE)
    assert [e["event"] for e in events] == ["start", "checkpoint", "checkpoint", "end"]
    assert events[-1]["reason"] == "max_steps"


def test_rl_run_publishes_increasing_versions_of_the_trained_weights(
    first_run: dict[str, Any], tiny_policy_path: Path
) -> None:
    calls = first_run["calls"]
    assert [c["version"] for c in calls] == [1, 2, 3]
    initial = _load(tiny_policy_path).state_dict()
    assert all(c["tensors"] == len(initial) for c in calls)
    assert len({c["digest"] for c in calls}) == 3  # every update changed the weights
    assert calls[0]["digest"] != weights_digest(initial)
    latest = first_run["latest"]
    assert set(latest) == set(initial)


def test_rl_checkpoint_reloads_and_holds_the_last_published_weights(
    first_run: dict[str, Any], tiny_policy_path: Path
) -> None:
    from transformers import AutoProcessor

    checkpoint = first_run["result"].checkpoint
    path = Path(checkpoint.path)
    assert path.name == "checkpoint_rl_000003"
    state = json.loads((path / "trainer_state.json").read_text())
    assert (state["kind"], state["step"], state["version"], state["world_size"]) == ("rl", 3, 3, 2)
    assert (path / "deepspeed" / "state").is_dir()
    model = _load(path)
    processor = AutoProcessor.from_pretrained(str(path))
    assert processor.tokenizer.convert_tokens_to_ids("<|image_pad|>") == model.config.image_token_id
    trained = model.state_dict()
    assert weights_digest(trained) == first_run["calls"][-1]["digest"]
    initial = _load(tiny_policy_path).state_dict()
    changed = [k for k in initial if not torch.equal(initial[k], trained[k])]
    assert len(changed) > len(initial) // 2, f"only {len(changed)} tensors changed"
    kept = sorted(p.name for p in path.parent.iterdir() if p.name.startswith("checkpoint_rl"))
    assert kept == ["checkpoint_rl_000002", "checkpoint_rl_000003"]


def test_rl_run_lowers_the_loss_on_its_fixed_batch(
    first_run: dict[str, Any], tiny_policy_path: Path, samples: list[dict[str, Any]]
) -> None:
    from train_loops.batching import ImageEncoder
    from train_loops.objectives import RLObjective

    reference = _load(tiny_policy_path)
    objective = RLObjective.from_config(
        LOSS, ImageEncoder.from_pretrained(str(tiny_policy_path)), reference=reference
    )
    with torch.no_grad():
        before = objective.micro_step(_load(tiny_policy_path), samples).loss.item()
        after = objective.micro_step(_load(first_run["result"].checkpoint.path), samples)
    assert after.loss.item() < before - 0.01, (before, after.metrics)


def test_rl_resumes_from_its_checkpoint_and_stops_when_bounded_data_ends(
    first_run: dict[str, Any], tiny_policy_path: Path, samples: list[dict[str, Any]], tmp_path: Path
) -> None:
    from train_loops.trainers import build_rl_trainer

    log = new_publish_log()
    cfg = RLTrainConfig(
        trainer=cpu_trainer(max_steps=50, checkpoint_every=50, cycle_data=False),
        optim=OPTIM,
        loss=LOSS,
    )
    # bounded this time and not cycled: 16 rows = 2 steps of 8, then the ranks agree to stop
    dataset = ray.data.from_arrow(to_table(samples + samples))
    trainer = build_rl_trainer(
        cfg, tiny_policy_path, {"train": dataset}, RecordingPublisher(log), tmp_path,
        resume_from=first_run["result"].checkpoint, run_name="rl-resumed",
    )  # fmt: skip
    result = trainer.fit()
    assert result.checkpoint is not None
    events = _jsonl(tmp_path / EVENTS_FILE)
    start, end = events[0], events[-1]
    assert (start["step"], start["version"], start["restored_optimizer"]) == (3, 3, True)
    assert (end["reason"], end["step"]) == ("data_exhausted", 5)
    assert [c["version"] for c in ray.get(log.get_calls.remote())] == [4, 5]
    assert [s["train/step"] for s in _jsonl(tmp_path / METRICS_FILE)] == [4, 5]
    state = json.loads((Path(result.checkpoint.path) / "trainer_state.json").read_text())
    assert (state["step"], state["version"], state["samples_seen"]) == (5, 5, 40)
    assert Path(result.checkpoint.path).name == "checkpoint_rl_000005"


def test_sft_phase_starts_from_the_rl_checkpoint(
    first_run: dict[str, Any], tiny_policy_path: Path, tmp_path: Path
) -> None:
    from train_loops.sample_maker import make_sft_samples
    from train_loops.trainers import build_sft_trainer

    rows = make_sft_samples(str(tiny_policy_path), n=8)
    log = new_publish_log()
    cfg = SFTTrainConfig(
        trainer=cpu_trainer(max_steps=3, checkpoint_every=10, cycle_data=True),
        optim=OptimConfig(lr=3e-3),
    )
    trainer = build_sft_trainer(
        cfg, tiny_policy_path, {"train": ray.data.from_arrow(to_sft_table(rows))},
        RecordingPublisher(log), tmp_path, resume_from=first_run["result"].checkpoint,
    )  # fmt: skip
    result = trainer.fit()
    assert result.checkpoint is not None
    start = _jsonl(tmp_path / EVENTS_FILE)[0]
    assert (start["step"], start["version"], start["restored_optimizer"]) == (0, 3, False)
    assert [c["version"] for c in ray.get(log.get_calls.remote())] == [4, 5, 6]
    steps = _jsonl(tmp_path / METRICS_FILE)
    losses = [s["loss/sft"] for s in steps]
    assert losses == sorted(losses, reverse=True) and losses[-1] < losses[0], losses
    assert all(s["kind"] == "sft" and "policy/entropy" in s for s in steps)
    path = Path(result.checkpoint.path)
    state = json.loads((path / "trainer_state.json").read_text())
    assert (state["kind"], state["step"], state["version"]) == ("sft", 3, 6)
    _load(path)


def test_sft_under_zero_0_checkpoints_and_resumes_with_its_optimizer(
    tiny_policy_path: Path, tmp_path: Path
) -> None:
    """ZeRO-0 (plain data parallel; the fastest CPU layout for small models) keeps the same
    checkpoint contract as ZeRO-2: weights that load, and optimizer state that a resume restores."""
    from train_loops.sample_maker import make_sft_samples
    from train_loops.trainers import build_sft_trainer

    rows = make_sft_samples(str(tiny_policy_path), n=8)

    def fit(max_steps: int, resume_from: Any) -> Any:
        cfg = SFTTrainConfig(
            trainer=cpu_trainer(
                max_steps=max_steps, checkpoint_every=10, zero_stage=0, cycle_data=True
            ),
            optim=OptimConfig(lr=3e-3),
        )
        data = {"train": ray.data.from_arrow(to_sft_table(rows))}
        return build_sft_trainer(
            cfg, tiny_policy_path, data, None, tmp_path, resume_from=resume_from
        ).fit()

    first = fit(2, None)
    assert first.checkpoint is not None
    second = fit(4, first.checkpoint)
    assert second.checkpoint is not None
    starts = [e for e in _jsonl(tmp_path / EVENTS_FILE) if e["event"] == "start"]
    assert [(e["step"], e["restored_optimizer"]) for e in starts] == [(0, False), (2, True)]
    state = json.loads((Path(second.checkpoint.path) / "trainer_state.json").read_text())
    assert (state["step"], state["zero_stage"]) == (4, 0)
    _load(second.checkpoint.path)
