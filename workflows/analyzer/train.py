"""Train the GUI analyzer (METHOD.md §6.3): SFT from the base policy's weights on the expert's
annotations, then its agreement with held-out annotations, judged through the real analyzer
deployment.

    python -m workflows.analyzer.train                                # embedded default
    python -m workflows.analyzer.train --eval-only analyzer.model_path=/ckpt/other-analyzer

Steps: join ``transitions/*.parquet`` with the valid records of ``annotations.jsonl``; hold out
``train.holdout_frac`` of the *episodes* (steps of one episode never straddle the split); build
SFT samples (prompt = the analyzer deployment's prompt for the transition, rendered and
tokenized by the checkpoint's processor, both screenshots; target = the canonical JSON answer
+ end-of-turn); SFT with the shared loop (Ray Train + DeepSpeed, ``build_sft_trainer``);
export the final weights as a plain Hugging Face folder ``<run_dir>/analyzer_model``; deploy
it as the analyzer app and judge the held-out transitions with ``analyze`` (the parser of the
RL job). The report (``analyzer_report.{json,md}``) gives the accuracy of consistency,
effectiveness and d, the parse rate, and the majority-class baseline for comparison.

Use it in RL: ``python -m workflows.online_rl analyzer.model_path=<run_dir>/analyzer_model``.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import re
import shutil
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serve_apps.prompting.analyzer import TRAINING_INFO, PromptStyle
from workflows.common.pipeline import parse_cli, write_jsonl
from workflows.common.pipeline_config import TRAINED_ANALYZER, PipelineConfig

MODEL_DIR = "analyzer_model"
PREDICTIONS = "analyzer_predictions.jsonl"
SFT_RUN = "analyzer_sft"
REPORT = "analyzer_report"
VERDICT_VALUE = re.compile(r'"(consistency|effectiveness)"\s*:\s*(-?\d+)')
"""The two verdict fields of an analyzer answer (METHOD.md §2); group 2 is the value."""


@dataclass(frozen=True)
class Labeled:
    """A transition with its valid annotation."""

    transition: dict[str, Any]
    annotation: dict[str, Any]

    @property
    def episode_id(self) -> str:
        return str(self.transition["episode_id"])


def load_labeled(run_dir: Path) -> list[Labeled]:
    from workflows.analyzer.annotate import ANNOTATIONS_FILE, read_annotations
    from workflows.analyzer.transitions import read_transitions

    notes = read_annotations(run_dir / ANNOTATIONS_FILE)
    ok = {k: v for k, v in notes.items() if v.get("status") == "ok"}
    if not ok:
        raise FileNotFoundError(
            f"no valid annotations in {run_dir}: run workflows.analyzer.annotate"
        )
    rows = read_transitions(run_dir / "transitions")
    return [Labeled(r, ok[r["transition_id"]]) for r in rows if r["transition_id"] in ok]


def split_by_episode(
    data: Sequence[Labeled], holdout_frac: float, seed: int
) -> tuple[list[Labeled], list[Labeled]]:
    """(train, holdout): whole episodes, a seeded shuffle; both sides non-empty when possible."""
    episodes = sorted({d.episode_id for d in data})
    random.Random(seed).shuffle(episodes)
    n = round(holdout_frac * len(episodes))
    if holdout_frac > 0 and len(episodes) >= 2:
        n = min(max(n, 1), len(episodes) - 1)
    held = set(episodes[:n])
    return [d for d in data if d.episode_id not in held], [d for d in data if d.episode_id in held]


def transition_request(t: Mapping[str, Any]) -> dict[str, Any]:
    """The analyzer deployment's ``analyze`` request for a stored transition."""
    return {
        "instruction": t["instruction"],
        "history": list(t["history"]),
        "screenshot_before": t["screenshot_before"],
        "screenshot_after": t["screenshot_after"],
        "response": t["response_text"],
        "action": t["executed_action"],
        "context": t["context"],
    }


class SampleBuilder:
    """SFT samples whose prompts are token-for-token what the analyzer deployment builds."""

    def __init__(
        self,
        model_path: str,
        full_prompt: bool,
        target_prefix: str = "",
        verdict_weight: float = 1.0,
        prompt_style: PromptStyle = "compact",
    ) -> None:
        from serve_apps.prompting.inputs import PromptEncoder

        if prompt_style not in ("compact", "minimal"):
            raise ValueError(
                f"analyzer.prompt_style={prompt_style!r}: the pipeline's transitions carry no "
                "history screens, so it trains the compact or minimal prompt only"
            )
        self.encoder = PromptEncoder.from_pretrained(model_path)
        self.full_prompt = full_prompt
        self.prompt_style = prompt_style
        self.target_prefix = target_prefix
        self.verdict_weight = verdict_weight

    def prompt_ids(self, t: Mapping[str, Any]) -> list[int]:
        from serve_apps.prompting.analyzer import transition_messages

        req = transition_request(t)
        messages, images = transition_messages(
            self.prompt_style,
            req["instruction"], req["history"], req["screenshot_before"], req["response"],
            req["action"], req["screenshot_after"], full=self.full_prompt,
            context=req["context"],
        )  # fmt: skip
        return self.encoder.encode(messages, self.encoder.load_images(images)).prompt_ids

    def target_ids(self, answer: str) -> list[int]:
        return self.encoder.answer_ids(self.target_prefix + answer)

    def target_weights(self, answer: str) -> list[float]:
        """1 per target token, ``verdict_weight`` on the tokens that spell the consistency
        and effectiveness values (found by character offsets, so any tokenizer works)."""
        text = self.target_prefix + answer
        enc = self.encoder.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = self.target_ids(answer)
        if list(enc["input_ids"]) != ids[: len(enc["input_ids"])]:
            raise ValueError(f"tokenizer offsets disagree with the target ids of {answer!r}")
        spans = [m.span(2) for m in VERDICT_VALUE.finditer(text)]
        weights = [1.0] * len(ids)
        for i, (a, b) in enumerate(enc["offset_mapping"]):
            if any(a < end and start < b for start, end in spans):
                weights[i] = self.verdict_weight
        return weights

    def row(self, item: Labeled) -> dict[str, Any]:
        t = item.transition
        answer = item.annotation["text"]
        row = {
            "sample_id": t["transition_id"],
            "source": "analyzer",
            "prompt_ids": self.prompt_ids(t),
            "target_ids": self.target_ids(answer),
            "screenshots": [t["screenshot_before"], t["screenshot_after"]],
        }
        if self.verdict_weight != 1.0:
            row["target_weights"] = self.target_weights(answer)
        return row


def planned_steps(cfg: PipelineConfig, num_train: int) -> int:
    if cfg.train.max_steps is not None:
        return cfg.train.max_steps
    per_step = cfg.train.trainer.samples_per_step
    return max(1, math.ceil(cfg.train.epochs * num_train / per_step))


def fit(cfg: PipelineConfig, base_model: str, rows: list[dict[str, Any]]) -> Path:
    """SFT with the shared loop; the final trainer checkpoint's folder."""
    import ray

    from train_loops.config import SFTTrainConfig
    from train_loops.schema import to_sft_table
    from train_loops.trainers import build_sft_trainer

    if len(rows) < cfg.train.trainer.samples_per_step:
        raise ValueError(
            f"{len(rows)} training samples < trainer.samples_per_step="
            f"{cfg.train.trainer.samples_per_step}: collect more or lower the batch"
        )
    steps = planned_steps(cfg, len(rows))
    trainer_cfg = cfg.train.trainer.model_copy(
        update={"max_steps": steps, "cycle_data": True, "checkpoint_every": steps}
    )
    sft = SFTTrainConfig(trainer=trainer_cfg, optim=cfg.train.optim)
    if not cfg.train.resume:
        shutil.rmtree(cfg.run_dir / SFT_RUN, ignore_errors=True)
    print(f"[train_analyzer] SFT: {len(rows)} samples, {steps} steps", flush=True)
    dataset = ray.data.from_arrow(to_sft_table(rows))
    trainer = build_sft_trainer(
        sft, base_model, {"train": dataset}, None, cfg.run_dir, None, SFT_RUN
    )
    result = trainer.fit()
    if result.error is not None:
        raise RuntimeError(f"analyzer SFT failed: {result.error}")
    if result.checkpoint is None:
        raise RuntimeError("analyzer SFT produced no checkpoint")
    return Path(result.checkpoint.path)


def export_model(checkpoint: Path, out: Path, info: Mapping[str, Any]) -> Path:
    """A plain Hugging Face folder (no optimizer state), replaced atomically; files are
    hard-linked when possible (no copy of large weights)."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for src in checkpoint.iterdir():
        if src.is_file():
            try:
                os.link(src, tmp / src.name)
            except OSError:
                shutil.copy2(src, tmp / src.name)
    (tmp / TRAINING_INFO).write_text(json.dumps(dict(info), indent=2))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


async def judge_all(handle: Any, items: Sequence[Labeled], concurrency: int) -> list[dict]:
    """The deployment's judgments of ``items`` (same order)."""
    from workflows.common.episodes import run_bounded

    jobs = [lambda it=it: handle.analyze.remote(transition_request(it.transition)) for it in items]
    out: list[dict[str, Any]] = [{} for _ in items]
    async for i, res in run_bounded(jobs, concurrency):
        if isinstance(res, BaseException):
            raise res
        out[i] = res
    return out


def _majority(values: Sequence[Any]) -> Any:
    return Counter(values).most_common(1)[0][0] if values else None


def agreement(
    holdout: Sequence[Labeled], predictions: Sequence[Mapping[str, Any]], train: Sequence[Labeled]
) -> dict[str, Any]:
    """Accuracies of consistency, effectiveness and d on the held-out set (a missing or
    unparsed prediction counts as wrong), with the train split's majority-class baseline."""
    fields = ("consistency", "effectiveness", "d")
    labels = [{f: it.annotation[f] for f in fields} for it in holdout]
    guess = {f: _majority([it.annotation[f] for it in train]) for f in fields}
    pairs = list(zip(predictions, labels, strict=True))
    hits = {f: [p.get(f) == lab[f] for p, lab in pairs] for f in fields}
    n = max(len(holdout), 1)
    by_source: dict[str, dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    confusion: dict[str, Counter[str]] = defaultdict(Counter)
    for i, it in enumerate(holdout):
        for f in fields:
            by_source[str(it.transition["source"])][f].append(hits[f][i])
        confusion[str(labels[i]["d"])][str(predictions[i].get("d"))] += 1
    return {
        "n": len(holdout),
        "accuracy": {f: sum(hits[f]) / n for f in fields},
        "parsed": sum(p.get("d") in (-1, 1) for p in predictions) / n,
        "baseline_majority": {f: sum(lab[f] == guess[f] for lab in labels) / n for f in fields},
        "by_source": {
            s: {"n": len(v["d"]), **{f: sum(v[f]) / len(v[f]) for f in fields}}
            for s, v in sorted(by_source.items())
        },
        "confusion_d": {k: dict(v) for k, v in sorted(confusion.items())},
    }


def report_markdown(report: Mapping[str, Any]) -> str:
    agree = report["agreement"]
    acc, base = agree["accuracy"], agree["baseline_majority"]
    lines = [
        f"# Analyzer agreement with held-out annotations ({agree['n']} transitions)",
        "",
        f"Analyzer: `{report['analyzer']}`; trained on {report['num_train']} annotations "
        f"({report.get('sft_steps', '-')} SFT steps). Parsed answers: {agree['parsed']:.1%}.",
        "",
        "| field | analyzer | majority baseline |",
        "|---|---|---|",
    ]
    lines += [
        f"| {f} | {acc[f]:.1%} | {base[f]:.1%} |" for f in ("consistency", "effectiveness", "d")
    ]
    lines += ["", "| source | n | consistency | effectiveness | d |", "|---|---|---|---|---|"]
    for s, v in agree["by_source"].items():
        lines.append(
            f"| {s} | {v['n']} | {v['consistency']:.1%} | {v['effectiveness']:.1%} | {v['d']:.1%} |"
        )
    lines += ["", f"d confusion (label → predicted): `{agree['confusion_d']}`", ""]
    return "\n".join(lines)


def _token_stats(rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    prompt = sorted(len(r["prompt_ids"]) for r in rows)
    target = sorted(len(r["target_ids"]) for r in rows)
    return {
        "prompt_max": prompt[-1],
        "target_p50": target[len(target) // 2],
        "target_max": target[-1],
    }


def train(cfg: PipelineConfig, train_set: list[Labeled]) -> tuple[Path, dict[str, Any]]:
    """SFT samples → fit → exported analyzer folder; (folder, training info)."""
    from workflows.common.pipeline import resolve_model_path

    base = resolve_model_path(cfg.train.base_model or cfg.policy.model_path, "policy")
    builder = SampleBuilder(
        base, cfg.analyzer.full_system_prompt, cfg.train.target_prefix, cfg.train.verdict_weight,
        cfg.analyzer.prompt_style,
    )  # fmt: skip
    rows = [builder.row(it) for it in train_set]
    random.Random(cfg.seed).shuffle(rows)
    stats = _token_stats(rows)
    if stats["target_max"] > cfg.analyzer.sampling.max_new_tokens:
        print(
            f"[train_analyzer] warning: answers take up to {stats['target_max']} tokens but "
            f"analyzer.sampling.max_new_tokens={cfg.analyzer.sampling.max_new_tokens}",
            flush=True,
        )
    t0 = time.time()
    checkpoint = fit(cfg, base, rows)
    info = {
        "base_model": base,
        "num_train": len(rows),
        "sft_steps": planned_steps(cfg, len(rows)),
        "fit_s": time.time() - t0,
        "full_system_prompt": cfg.analyzer.full_system_prompt,
        "prompt_style": cfg.analyzer.prompt_style,
        "target_prefix": cfg.train.target_prefix,
        "tokens": stats,
        "trainer_checkpoint": str(checkpoint),
    }
    return export_model(checkpoint, cfg.run_dir / MODEL_DIR, info), info


def evaluate_analyzer(cfg: PipelineConfig, model_path: str, holdout: list[Labeled]) -> list[dict]:
    """Deploy the analyzer (the RL job's app) and judge the held-out transitions."""
    from serve_apps.analyzer import build_analyzer_app
    from workflows.common.pipeline import serve_app, start_serve

    name = f"{cfg.run_name}-analyzer"
    app_cfg = cfg.analyzer.model_copy(
        update={"model_path": model_path, "name": name, "route_prefix": f"/{name}"}
    )
    start_serve(cfg.serve_http_port)
    with serve_app(build_analyzer_app(app_cfg), name, app_cfg.route_prefix) as handle:
        return asyncio.run(judge_all(handle, holdout, cfg.train.eval_concurrency))


def write_predictions(
    path: Path, holdout: Sequence[Labeled], predictions: Sequence[Mapping[str, Any]]
) -> None:
    """One line per held-out transition: its label beside the analyzer's verdicts, parse
    status and raw answer, to see what a low agreement is made of (written atomically)."""
    fields = ("consistency", "effectiveness", "d")
    write_jsonl(path, (
        {"transition_id": item.transition["transition_id"], "source": item.transition["source"],
         "label": {f: item.annotation[f] for f in fields},
         **{k: pred.get(k) for k in (*fields, "status", "reason", "raw")}}
        for item, pred in zip(holdout, predictions, strict=True)
    ))  # fmt: skip


def run(cfg: PipelineConfig, eval_only: bool = False) -> dict[str, Any]:
    from workflows.common.pipeline import ray_session, resolve_model_path, write_json

    labeled = load_labeled(cfg.run_dir)
    train_set, holdout = split_by_episode(labeled, cfg.train.holdout_frac, cfg.seed)
    holdout = holdout[: cfg.train.eval_limit]
    print(f"[train_analyzer] {len(train_set)} train / {len(holdout)} held-out", flush=True)
    report: dict[str, Any] = {"num_train": len(train_set), "num_holdout": len(holdout)}
    with ray_session(cfg):
        if eval_only:
            if cfg.analyzer.model_path == TRAINED_ANALYZER:
                model = str(cfg.run_dir / MODEL_DIR)
            else:
                model = resolve_model_path(cfg.analyzer.model_path, "analyzer")
        else:
            path, info = train(cfg, train_set)
            model, report = str(path), {**report, **info}
        report["analyzer"] = model
        if holdout:
            predictions = evaluate_analyzer(cfg, model, holdout)
            report["agreement"] = agreement(holdout, predictions, train_set)
            write_predictions(cfg.run_dir / PREDICTIONS, holdout, predictions)
    write_json(cfg.run_dir / f"{REPORT}.json", report)
    if "agreement" in report:
        (cfg.run_dir / f"{REPORT}.md").write_text(report_markdown(report))
        print(report_markdown(report), flush=True)
    print(f"[train_analyzer] analyzer checkpoint: {model}", flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    def extra(parser: Any) -> None:
        parser.add_argument(
            "--eval-only",
            action="store_true",
            help="skip training; report the agreement of analyzer.model_path",
        )

    parsed = parse_cli("python -m workflows.analyzer.train", __doc__, argv, extra)
    if isinstance(parsed, int):
        return parsed
    cfg, args = parsed
    run(cfg, eval_only=args.eval_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
