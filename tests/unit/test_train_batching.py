"""Step samples → Qwen3-VL inputs: layout, image tokens, exact log-probs under padding.

Uses the tiny policy checkpoint and real samples sampled from it (train_loops.sample_maker).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from train_loops.batching import (
    ImageEncoder,
    build_sequence_batch,
    collate_rl,
    collate_sft,
    response_logprobs,
)
from train_loops.config import LossConfig
from train_loops.objectives import RLObjective, SFTObjective
from train_loops.sample_maker import make_sft_samples, make_step_samples
from train_loops.schema import SampleError, to_sft_table, to_table


@pytest.fixture(scope="module")
def encoder(tiny_policy_path: Path) -> ImageEncoder:
    return ImageEncoder.from_pretrained(str(tiny_policy_path))


@pytest.fixture(scope="module")
def model(tiny_policy_path: Path):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(str(tiny_policy_path)).eval()


@pytest.fixture(scope="module")
def rows(tiny_policy_path: Path) -> list[dict]:
    return make_step_samples(str(tiny_policy_path), num_groups=1, group_size=4, max_new_tokens=10)


def test_samples_satisfy_the_schema(rows: list[dict], tiny_policy_path: Path) -> None:
    assert to_table(rows).num_rows == 4
    assert to_sft_table(make_sft_samples(str(tiny_policy_path), n=2)).num_rows == 2
    assert abs(sum(r["advantage"] for r in rows)) < 1e-5  # GRPO advantages are centred


def test_layout_left_padded_with_right_aligned_response_window(
    rows: list[dict], encoder: ImageEncoder
) -> None:
    rows = [dict(rows[0]), dict(rows[1])]
    rows[1]["response_ids"] = rows[1]["response_ids"][:3]
    rows[1]["behavior_logprobs"] = rows[1]["behavior_logprobs"][:3]
    rows[1]["privileged_logprobs"] = rows[1]["privileged_logprobs"][:3]
    batch, terms = collate_rl(rows, encoder)
    n0, n1 = len(rows[0]["response_ids"]), 3
    seq0 = rows[0]["prompt_ids"] + rows[0]["response_ids"]
    seq1 = rows[1]["prompt_ids"] + rows[1]["response_ids"]
    length = max(len(seq0), len(seq1))
    ids, attn = batch.inputs.input_ids, batch.inputs.attention_mask
    assert ids.shape == (2, length) and batch.window == n0
    assert ids[1, length - len(seq1) :].tolist() == seq1  # exact ids, left-padded
    assert attn[1].tolist() == [0] * (length - len(seq1)) + [1] * len(seq1)
    assert batch.loss_mask[1].tolist() == [False] * (n0 - n1) + [True] * n1
    assert batch.targets[1, -n1:].tolist() == rows[1]["response_ids"]
    assert terms.behavior_logprobs[1, -n1:].tolist() == pytest.approx(rows[1]["behavior_logprobs"])
    image_positions = batch.inputs.mm_token_type_ids.bool()
    assert torch.equal(image_positions, ids == encoder.image_token_id)
    thw = batch.inputs.image_grid_thw
    assert thw is not None and batch.inputs.pixel_values is not None
    assert batch.inputs.pixel_values.shape[0] == int(thw.prod(dim=-1).sum())
    assert int(image_positions.sum()) == int(encoder.tokens_per_image(thw).sum())


def test_padded_batch_logprobs_equal_single_sample_logprobs(
    rows: list[dict], encoder: ImageEncoder, model
) -> None:
    rows = [dict(rows[0]), dict(rows[1])]
    rows[0]["response_ids"] = rows[0]["response_ids"][:4]  # ragged responses
    batch = build_sequence_batch(
        [r["prompt_ids"] for r in rows],
        [r["response_ids"] for r in rows],
        [r["screenshots"] for r in rows],
        encoder,
    )
    with torch.no_grad():
        together, entropy = response_logprobs(model, batch, with_entropy=True)
        for i, row in enumerate(rows):
            single = build_sequence_batch(
                [row["prompt_ids"]], [row["response_ids"]], [row["screenshots"]], encoder
            )
            alone, _ = response_logprobs(model, single)
            n = len(row["response_ids"])
            torch.testing.assert_close(together[i, -n:], alone[0], atol=1e-5, rtol=1e-5)
    assert entropy is not None and bool((entropy[batch.loss_mask] > 0).all())
    # the untouched sample's rescoring reproduces its behaviour log-probs from generation
    n = len(rows[1]["response_ids"])
    expected = torch.tensor(rows[1]["behavior_logprobs"])
    torch.testing.assert_close(together[1, -n:], expected, atol=1e-4, rtol=1e-4)


def test_image_token_mismatch_is_refused(rows: list[dict], encoder: ImageEncoder) -> None:
    row = dict(rows[0])
    row["screenshots"] = row["screenshots"] * 2  # twice the images the prompt has room for
    with pytest.raises(SampleError, match="image-pad tokens"):
        collate_rl([row], encoder)


def test_image_token_in_a_response_is_refused(rows: list[dict], encoder: ImageEncoder) -> None:
    row = dict(rows[0])
    row["response_ids"] = [*row["response_ids"][:-1], encoder.image_token_id]
    with pytest.raises(SampleError, match=r"response has 1 image-pad token"):
        collate_rl([row], encoder)


def test_per_token_length_mismatch_is_refused(rows: list[dict], encoder: ImageEncoder) -> None:
    row = dict(rows[0])
    row["privileged_logprobs"] = row["privileged_logprobs"][:-1]
    with pytest.raises(SampleError, match="privileged_logprobs"):
        collate_rl([row], encoder)


def test_rl_objective_micro_batches_average_to_the_whole_batch(
    rows: list[dict], encoder: ImageEncoder, model
) -> None:
    # Equal micro-batches + DeepSpeed's averaging = the loss of the whole batch, even though
    # each micro-batch is padded differently.
    objective = RLObjective.from_config(LossConfig(kl_coef=0.0), encoder)
    with torch.no_grad():
        whole = objective.micro_step(model, rows)
        halves = [objective.micro_step(model, rows[:2]), objective.micro_step(model, rows[2:])]
    mean = (halves[0].loss + halves[1].loss) / 2
    assert whole.loss.item() == pytest.approx(mean.item(), rel=1e-4, abs=1e-6)
    assert whole.tokens == halves[0].tokens + halves[1].tokens
    for key in ("loss/pg", "loss/sd", "loss/kl", "sd/gate_mean", "policy/entropy"):
        assert key in whole.metrics


def test_rl_objective_backward_reaches_every_trained_weight(
    rows: list[dict], encoder: ImageEncoder, tiny_policy_path: Path
) -> None:
    from transformers import AutoModelForImageTextToText

    policy = AutoModelForImageTextToText.from_pretrained(str(tiny_policy_path)).train()
    reference = AutoModelForImageTextToText.from_pretrained(str(tiny_policy_path)).eval()
    objective = RLObjective.from_config(LossConfig(), encoder, reference=reference)
    out = objective.micro_step(policy, rows)
    out.loss.backward()
    grads = {n: p.grad for n, p in policy.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    assert out.metrics["loss/kl"] == pytest.approx(0.0, abs=1e-6)  # policy == reference


def test_sft_objective_trains_targets_only(tiny_policy_path: Path, encoder: ImageEncoder) -> None:
    rows = make_sft_samples(str(tiny_policy_path), n=2)
    batch = collate_sft(rows, encoder)
    assert batch.loss_mask.sum(dim=1).tolist() == [len(r["target_ids"]) for r in rows]
    from transformers import AutoModelForImageTextToText

    policy = AutoModelForImageTextToText.from_pretrained(str(tiny_policy_path)).train()
    out = SFTObjective(encoder).micro_step(policy, rows)
    assert out.metrics["loss/sft"] > 0 and out.tokens == int(batch.loss_mask.sum())
    with pytest.raises(SampleError, match="lacks fields"):
        SFTObjective(encoder).micro_step(policy, [{"sample_id": "x", "prompt_ids": [1]}])


def test_sft_target_weights_align_with_the_loss_mask(
    tiny_policy_path: Path, encoder: ImageEncoder
) -> None:
    from train_loops.batching import sft_target_weights

    rows = make_sft_samples(str(tiny_policy_path), n=2)
    assert sft_target_weights(rows, 9) is None  # no row gives weights: the plain mean
    n0 = len(rows[0]["target_ids"])
    rows[0]["target_weights"] = [float(i + 2) for i in range(n0)]
    batch = collate_sft(rows, encoder)
    weights = sft_target_weights(rows, batch.window)
    assert weights is not None and weights.shape == batch.loss_mask.shape
    assert weights[0][batch.loss_mask[0]].tolist() == rows[0]["target_weights"]
    assert set(weights[1][batch.loss_mask[1]].tolist()) == {1.0}
    assert to_sft_table(rows).column("target_weights").null_count == 1
    rows[1]["target_weights"] = [1.0]
    with pytest.raises(SampleError, match="target_weights has 1 values"):
        to_sft_table(rows)
    rows[1]["target_weights"] = [-1.0] * len(rows[1]["target_ids"])
    with pytest.raises(SampleError, match="target_weights must be finite, >= 0"):
        to_sft_table(rows)


def test_weighted_sft_objective_equals_the_plain_one_at_weight_1(
    tiny_policy_path: Path, encoder: ImageEncoder
) -> None:
    from transformers import AutoModelForImageTextToText

    policy = AutoModelForImageTextToText.from_pretrained(str(tiny_policy_path)).eval()
    rows = make_sft_samples(str(tiny_policy_path), n=2)
    plain = SFTObjective(encoder).micro_step(policy, rows).metrics["loss/sft"]
    ones = [{**r, "target_weights": [1.0] * len(r["target_ids"])} for r in rows]
    assert SFTObjective(encoder).micro_step(policy, ones).metrics["loss/sft"] == pytest.approx(
        plain, rel=1e-5
    )
    heavy = [{**r, "target_weights": [1.0] * (len(r["target_ids"]) - 1) + [100.0]} for r in rows]
    assert SFTObjective(encoder).micro_step(policy, heavy).metrics["loss/sft"] != pytest.approx(
        plain, rel=1e-3
    )


def test_length_sorted_micro_batches_give_the_same_step_with_less_padding(
    tiny_policy_path: Path, encoder: ImageEncoder
) -> None:
    from transformers import AutoModelForImageTextToText

    from train_loops.loop import by_length

    rows = make_sft_samples(str(tiny_policy_path), n=4)
    shortest = min(len(r["prompt_ids"]) for r in rows)
    for row, extra in zip(rows, (9, 2, 8, 3), strict=True):  # long, short, long, short
        row["target_ids"] = row["target_ids"][: shortest - len(row["prompt_ids"]) + 12 + extra]
    ordered = by_length(rows)
    sizes = [len(r["prompt_ids"]) + len(r["target_ids"]) for r in ordered]
    assert sizes == sorted(sizes) and [r["sample_id"] for r in ordered] != [
        r["sample_id"] for r in rows
    ]

    def step(order: list[dict]) -> tuple[dict[str, torch.Tensor], int]:
        """Gradient of two accumulated micro-batches of 2, and the positions computed."""
        policy = AutoModelForImageTextToText.from_pretrained(str(tiny_policy_path)).train()
        positions = 0
        for chunk in (order[:2], order[2:]):
            (SFTObjective(encoder).micro_step(policy, chunk).loss / 2).backward()
            positions += collate_sft(chunk, encoder).inputs.input_ids.numel()
        return {n: p.grad.clone() for n, p in policy.named_parameters()}, positions

    plain, plain_positions = step(rows)
    sorted_grads, sorted_positions = step(ordered)
    assert sorted_positions < plain_positions
    for name, grad in plain.items():
        assert torch.allclose(grad, sorted_grads[name], atol=1e-6, rtol=1e-4), name
