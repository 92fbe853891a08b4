"""Behaviour cloning: demonstrations → SFT samples → the project's SFT loop → a policy folder.

Each training state gives one *ordinary* sample (the elements-style context ``c`` → the
expert's answer). A share of them also gives a *privileged twin*: the same context with the
guidance block of METHOD.md §3 appended (guide = the expert's answer), same target; of those, a
share shows the task's generic description instead of the concrete instruction. And a share
gives a *follow twin*: generic task line, guidance naming a random listed element, that
element as the target. Without follow twins the model learned the page layout and ignored the
guidance (the expert's element is predictable from the page for most states: guidance gap
≈ 0 nats on held-out states); with them, the guidance is the only thing that predicts the
answer, and the policy learns what self-distillation presumes: under the privileged context
the guided answer becomes much more likely.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from serve_apps.prompting.messages import guidance_text, privileged_messages
from workflows.warm_start.config import BCConfig
from workflows.warm_start.demos import STYLE, Demo

BC_RUN = "bc_sft"


def split_demos(demos: Sequence[Demo], heldout_frac: float) -> tuple[list[Demo], list[Demo]]:
    """(train, held-out) by whole episodes."""
    train = [d for d in demos if d.heldout_key >= heldout_frac]
    held = [d for d in demos if d.heldout_key < heldout_frac]
    return train, held


def contexts(demo: Demo, instruction: str | None = None) -> tuple[list[dict], list[dict]]:
    """(ordinary, privileged) messages of a demonstration state."""
    messages, _ = STYLE.prompt(instruction or demo.instruction, [demo.screen], demo.history)
    return messages, privileged_messages(messages, guidance_text(demo.guide, demo.avoid))


def sft_rows(
    demos: Sequence[Demo], cfg: BCConfig, encoder: Any, generic: dict[str, str], seed: int
) -> list[dict[str, Any]]:
    """SFT rows (``train_loops.schema`` SFT schema) for the training demonstrations."""
    rng = random.Random(seed)
    rows = []
    for i, d in enumerate(demos):
        ordinary, privileged = contexts(d)
        variants = [("bc", ordinary)]
        if rng.random() < cfg.privileged_frac:
            if rng.random() < cfg.blind_frac and d.task in generic:
                privileged = contexts(d, generic[d.task])[1]
            variants.append(("bc-privileged", privileged))
        targets = {source: d.answer for source, _ in variants}
        follow = (
            follow_twin(d, generic.get(d.task), rng) if rng.random() < cfg.follow_frac else None
        )
        if follow is not None:
            variants.append(("bc-follow", follow[0]))
            targets["bc-follow"] = follow[1]
        images = encoder.load_images([d.screen.png])
        for source, messages in variants:
            rows.append({
                "sample_id": f"{d.episode}/{i}/{source}", "source": source,
                "prompt_ids": encoder.encode(messages, images).prompt_ids,
                "target_ids": encoder.answer_ids(targets[source]), "screenshots": [d.screen.png],
            })  # fmt: skip
    rng.shuffle(rows)
    return rows


def follow_twin(
    demo: Demo, generic: str | None, rng: random.Random
) -> tuple[list[dict], str] | None:
    """(privileged messages, target) whose guidance names a random element one can act on;
    None where the page lists fewer than two such elements or the task has no generic line."""
    from serve_apps.prompting.elements import element_label

    acting = [e for e in demo.screen.elements if e.node.role != "text"]
    if generic is None or len(acting) < 2:
        return None
    chosen, other = rng.sample(acting, 2)
    guide = f"click {chosen.index} ({element_label(chosen)})"
    avoid = f"click {element_label(other)}"
    messages, _ = STYLE.prompt(generic, [demo.screen], demo.history)
    return privileged_messages(messages, guidance_text(guide, avoid)), f"click {chosen.index}"


def fit(cfg: BCConfig, base_model: Path, rows: list[dict[str, Any]], run_dir: Path) -> Path:
    """SFT with the shared loop (Ray Train + DeepSpeed); the final checkpoint's folder."""
    import ray

    from train_loops.config import SFTTrainConfig
    from train_loops.schema import to_sft_table
    from train_loops.trainers import build_sft_trainer

    trainer = cfg.trainer.model_copy(
        update={"max_steps": cfg.steps, "cycle_data": True, "checkpoint_every": cfg.steps}
    )
    sft = SFTTrainConfig(trainer=trainer, optim=cfg.optim)
    dataset = ray.data.from_arrow(to_sft_table(rows))
    result = build_sft_trainer(
        sft, base_model, {"train": dataset}, None, run_dir, None, BC_RUN
    ).fit()
    if result.error is not None:
        raise RuntimeError(f"behaviour cloning failed: {result.error}")
    if result.checkpoint is None:
        raise RuntimeError("behaviour cloning produced no checkpoint")
    return Path(result.checkpoint.path)
