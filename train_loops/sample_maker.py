"""Real step samples from a policy checkpoint, without an environment or analyzer.

For benchmarks and trainer tests: screenshots are drawn (a coloured page with one button), the
policy *samples* its response with plain ``transformers`` generation (behaviour log-probs from
the generation's own logits, temperature 1, no truncation), and the same response is
rescored by prefill under the ordinary context and under a privileged context (the METHOD.md §3 guidance block appended to the user
turn). Verdicts and terminal scores are drawn at random, advantages are the real GRPO ones.
Every row satisfies ``train_loops.schema.validate_sample``. SFT samples pair the same kind of
prompt with a scripted answer that clicks the button.

    python -m train_loops.sample_maker MODEL_PATH out.parquet --groups 2 --group-size 4
"""

from __future__ import annotations

import argparse
import io
import json
import random
import time
from dataclasses import dataclass
from typing import Any

import torch

from train_loops.batching import ImageEncoder, build_sequence_batch, response_logprobs
from train_loops.losses import group_advantages, rewards_from_scores

# Prompt conventions of the rollout side (METHOD.md §2–§3), repeated here because train_loops
# may not import workflows; only the synthetic samples use them.
GUIDANCE = "[GUIDE]\n{guide}\n\n[AVOID]\n{avoid}"
PRIVILEGED = "\n\n[PRIVILEGED_ACTION_GUIDANCE]\n{guidance}\n[/PRIVILEGED_ACTION_GUIDANCE]"
INSTRUCTIONS = ["Click the OK button.", "Press submit.", "Click on the blue box.", "Close it."]
COLORS = [(200, 40, 40), (40, 160, 60), (40, 60, 200), (220, 180, 30)]


def draw_screenshot(rng: random.Random, size: tuple[int, int] = (160, 210)) -> tuple[bytes, tuple]:
    """A PNG page with one button; returns (png bytes, button centre on the 0..999 grid)."""
    from PIL import Image, ImageDraw

    w, h = size
    img = Image.new("RGB", size, (245, 245, 245))
    x0, y0 = rng.randint(0, w - 40), rng.randint(0, h - 20)
    ImageDraw.Draw(img).rectangle([x0, y0, x0 + 40, y0 + 20], fill=rng.choice(COLORS))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    centre = (round((x0 + 20) / w * 999), round((y0 + 10) / h * 999))
    return buf.getvalue(), centre


@dataclass
class PolicyScorer:
    """A checkpoint's model and processor, used for sampling and rescoring."""

    model: Any
    processor: Any
    encoder: ImageEncoder

    @classmethod
    def load(cls, model_path: str) -> PolicyScorer:
        from transformers import AutoModelForImageTextToText, AutoProcessor

        model = AutoModelForImageTextToText.from_pretrained(model_path).eval()
        processor = AutoProcessor.from_pretrained(model_path)
        return cls(model, processor, ImageEncoder.from_pretrained(model_path))

    def prompt_ids(self, text: str, screenshots: list[bytes]) -> list[int]:
        """Chat-templated user turn with the images, ready for the assistant's answer."""
        from PIL import Image

        content = [{"type": "image"} for _ in screenshots] + [{"type": "text", "text": text}]
        chat = [{"role": "user", "content": content}]
        prompt = self.processor.apply_chat_template(
            chat, add_generation_prompt=True, tokenize=False
        )
        images = [Image.open(io.BytesIO(b)).convert("RGB") for b in screenshots] or None
        enc = self.processor(text=[prompt], images=images, return_tensors="pt")
        return enc["input_ids"][0].tolist()

    def vision_token_ids(self) -> list[int]:
        """Image/video placeholder and vision delimiter ids: a response holding one would put
        an image slot without features into the trainer's sequence."""
        names = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
        return [int(i) for n in names if (i := getattr(self.model.config, n, None)) is not None]

    @torch.no_grad()
    def sample(self, prompt: list[int], shots: list[bytes], max_new_tokens: int) -> tuple:
        """Sample a response: (token ids, behaviour log-probs), temperature 1, no top-k/p."""
        batch = build_sequence_batch([prompt], [[]], [shots], self.encoder)
        out = self.model.generate(
            **batch.inputs._asdict(),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            suppress_tokens=self.vision_token_ids(),  # as the serving backends do
            output_logits=True,
            return_dict_in_generate=True,
        )
        ids = out.sequences[0, len(prompt) :].tolist()
        steps = zip(out.logits, ids, strict=True)
        logps = [torch.log_softmax(lg[0].float(), -1)[t].item() for lg, t in steps]
        return ids, logps

    @torch.no_grad()
    def score(self, prompt: list[int], response: list[int], shots: list[bytes]) -> list[float]:
        """log π(y_t | prompt, y_<t) of a given response (prefill only)."""
        batch = build_sequence_batch([prompt], [response], [shots], self.encoder)
        lp, _ = response_logprobs(self.model, batch)
        return lp[0].tolist()


@dataclass(frozen=True)
class _Episode:
    group: str
    episode: str
    instruction: str
    score: float
    advantage: float
    num_steps: int


def make_step_samples(
    model_path: str,
    num_groups: int = 2,
    group_size: int = 4,
    steps_per_episode: int = 1,
    max_new_tokens: int = 16,
    seed: int = 0,
    behavior_version: int = 0,
) -> list[dict[str, Any]]:
    """``num_groups × group_size × steps_per_episode`` step samples sampled from the policy."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    policy = PolicyScorer.load(model_path)
    rows: list[dict[str, Any]] = []
    for g in range(num_groups):
        instruction = rng.choice(INSTRUCTIONS)
        scores = [float(rng.random() < 0.5) for _ in range(group_size)]
        adv = group_advantages(rewards_from_scores(torch.tensor(scores)), torch.zeros(group_size))
        for e, score in enumerate(scores):
            ep = _Episode(
                f"g{g}", f"g{g}e{e}", instruction, score, float(adv[e]), steps_per_episode
            )
            for s in range(steps_per_episode):
                rows.append(_step_row(policy, rng, ep, s, max_new_tokens, behavior_version))
    return rows


def _verdict(rng: random.Random) -> tuple[int | None, int | None, int, float]:
    """(consistency, effectiveness, d, v) drawn like an analyzer's: d=0 when a field is missing."""
    c, e = rng.randint(0, 1), rng.randint(0, 1)
    if rng.random() < 0.2:
        return None, e, 0, e / 2
    return c, e, (1 if c and e else -1), (c + e) / 2


def _step_row(
    policy: PolicyScorer, rng: random.Random, ep: _Episode, step: int, max_new: int, version: int
) -> dict[str, Any]:
    shot, _ = draw_screenshot(rng)
    prompt = policy.prompt_ids(ep.instruction, [shot])
    response, behaviour = policy.sample(prompt, [shot], max_new)
    guide, avoid = "click the button", "clicking elsewhere"
    guidance = PRIVILEGED.format(guidance=GUIDANCE.format(guide=guide, avoid=avoid))
    privileged_prompt = policy.prompt_ids(ep.instruction + guidance, [shot])
    consistency, effectiveness, d, v = _verdict(rng)
    return {
        "sample_id": f"{ep.episode}s{step}", "task_id": ep.group, "group_id": ep.group,
        "episode_id": ep.episode, "step_index": step, "num_steps": ep.num_steps,
        "prompt_ids": prompt, "response_ids": response,
        "behavior_logprobs": behaviour,
        "ordinary_logprobs": policy.score(prompt, response, [shot]),
        "privileged_logprobs": policy.score(privileged_prompt, response, [shot]),
        "screenshots": [shot],
        "response_text": policy.processor.tokenizer.decode(response),
        "action": json.dumps({"action": "wait"}), "score": ep.score,
        "reward": 1.0 if ep.score >= 1.0 else -1.0, "advantage": ep.advantage,
        "consistency": consistency, "effectiveness": effectiveness,
        "guide": guide, "avoid": avoid, "d": d, "v": v,
        "behavior_version": version, "privileged_version": version,
        "t_generate_s": 0.0, "t_env_s": 0.0, "t_analyze_s": 0.0, "t_score_s": 0.0,
        "created_at": time.time(),
    }  # fmt: skip


def make_sft_samples(model_path: str, n: int = 8, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` SFT samples: a drawn page and instruction → a scripted click on its button."""
    from transformers import AutoProcessor

    rng = random.Random(seed)
    processor = AutoProcessor.from_pretrained(model_path)
    policy = PolicyScorer(None, processor, ImageEncoder.from_pretrained(model_path))
    rows = []
    for i in range(n):
        shot, (x, y) = draw_screenshot(rng)
        call = {"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [x, y]}}
        answer = f"Action: click the button.\n<tool_call>{json.dumps(call)}</tool_call><|im_end|>"
        rows.append(
            {
                "sample_id": f"sft{i}",
                "source": "scripted",
                "prompt_ids": policy.prompt_ids(rng.choice(INSTRUCTIONS), [shot]),
                "target_ids": processor.tokenizer.encode(answer, add_special_tokens=False),
                "screenshots": [shot],
            }
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    from train_loops.schema import write_parquet

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_path")
    parser.add_argument("out", help="Parquet file of step samples")
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args(argv)
    rows = make_step_samples(a.model_path, a.groups, a.group_size, a.steps, seed=a.seed)
    print(f"wrote {len(rows)} step samples to {write_parquet(rows, a.out)}")


if __name__ == "__main__":
    main()
