"""Annotate every collected transition with the analyzer JSON (METHOD.md §2 and §6.2).

    python -m workflows.analyzer.annotate                         # oracle expert (embedded default)
    OPENAI_API_KEY=sk-... python -m workflows.analyzer.annotate annotate.expert.type=openai \\
        annotate.expert.base_url=https://host/v1 annotate.expert.model=some-vlm

Reads ``<run_dir>/transitions/*.parquet`` (from ``workflows.analyzer.collect``), asks the configured
expert (``workflows.analyzer.experts``), validates each answer with the analyzer deployment's parser
and appends one JSON line per transition to ``<run_dir>/annotations.jsonl`` (flushed line by
line: a killed run loses at most the answers in flight). A rerun skips transitions already
annotated (and, unless ``annotate.retry_rejects``, those rejected); expert errors (retries
exhausted) are not written, so a rerun asks again. Counts go to ``annotate_summary.json``.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from train_loops.jsonl import JsonlWriter, iter_jsonl
from workflows.common.pipeline import parse_cli
from workflows.common.pipeline_config import PipelineConfig

ANNOTATIONS_FILE = "annotations.jsonl"
SUMMARY_FILE = "annotate_summary.json"


def read_annotations(path: Path) -> dict[str, dict[str, Any]]:
    """The last record per transition id; lines cut by a kill are ignored."""
    return {rec["transition_id"]: rec for rec in iter_jsonl(path) if "transition_id" in rec}


async def annotate_one(expert: Any, t: Mapping[str, Any], max_text_chars: int) -> dict[str, Any]:
    """Ask the expert (again when an answer does not validate); an ok or rejected record."""
    from workflows.analyzer.experts import ExpertError, judgment_json, validate_answer

    t0 = time.perf_counter()
    base = {
        "transition_id": t["transition_id"],
        "episode_id": t["episode_id"],
        "source": t["source"],
        "expert": expert.name,
    }
    raw, reason = "", None
    for attempt in range(expert.invalid_retries + 1):
        try:
            raw = await expert.judge(t)
        except ExpertError as exc:
            if not exc.permanent:
                raise
            raw, reason = "", f"expert refused: {exc}"
            break
        judgment, reason = validate_answer(raw, max_text_chars)
        if judgment is not None:
            c, e = int(judgment.consistency), int(judgment.effectiveness)  # type: ignore[arg-type]
            return {
                **base, "status": "ok", "consistency": c, "effectiveness": e,
                "guide": judgment.guide, "avoid": judgment.avoid, "d": judgment.d,
                "text": judgment_json(c, e, judgment.guide, judgment.avoid), "raw": raw,
                "attempts": attempt + 1, "latency_s": time.perf_counter() - t0,
                "created_at": time.time(),
            }  # fmt: skip
    return {
        **base, "status": "rejected", "reason": reason, "raw": raw[:2000],
        "attempts": attempt + 1, "latency_s": time.perf_counter() - t0,
        "created_at": time.time(),
    }  # fmt: skip


def _todo(
    rows: list[dict[str, Any]], done: Mapping[str, dict[str, Any]], retry_rejects: bool
) -> list[dict[str, Any]]:
    def settled(tid: str) -> bool:
        rec = done.get(tid)
        return rec is not None and (rec["status"] == "ok" or not retry_rejects)

    return [r for r in rows if not settled(r["transition_id"])]


def _shards(folder: Path) -> Iterator[Path]:
    from workflows.analyzer.transitions import shard_paths

    paths = shard_paths(folder)
    if not paths:
        raise FileNotFoundError(
            f"no transitions in {folder}: run python -m workflows.analyzer.collect"
        )
    yield from paths


async def annotate(cfg: PipelineConfig, expert: Any | None = None) -> dict[str, Any]:
    """Annotate what is left; returns the summary (also written as JSON)."""
    from workflows.analyzer.experts import ExpertError, make_expert
    from workflows.analyzer.transitions import read_transitions
    from workflows.common.episodes import run_bounded

    a = cfg.annotate
    out_path = cfg.run_dir / ANNOTATIONS_FILE
    done = read_annotations(out_path)
    expert = expert or make_expert(a.expert)
    log, now = JsonlWriter(out_path), Counter[str]()
    errors: list[str] = []
    ids: set[str] = set()
    budget = a.limit
    try:
        for shard in _shards(cfg.run_dir / "transitions"):
            rows = read_transitions(shard)
            ids.update(r["transition_id"] for r in rows)
            todo = _todo(rows, done, a.retry_rejects)[:budget]
            if budget is not None:
                budget -= len(todo)
            jobs = [lambda t=t: annotate_one(expert, t, a.max_text_chars) for t in todo]
            async for i, res in run_bounded(jobs, expert.concurrency):
                if isinstance(res, ExpertError):
                    now["errors"] += 1
                    errors.append(str(res)[:300])
                    continue
                if isinstance(res, BaseException):
                    raise res
                log.write(res)
                done[todo[i]["transition_id"]] = res
                now[res["status"]] += 1
    finally:
        await expert.close()
    final = {tid: rec for tid, rec in done.items() if tid in ids}
    return summarize(final, len(ids), now, errors, getattr(expert, "stats", {}))


def summarize(
    records: Mapping[str, dict[str, Any]],
    total: int,
    now: Counter[str],
    errors: list[str],
    expert_stats: Mapping[str, int],
) -> dict[str, Any]:
    """Counts over the final records: status, reject reasons, verdicts by source."""
    status = Counter(r["status"] for r in records.values())
    reasons = Counter(
        str(r.get("reason") or "?").split(":")[0] for r in records.values() if r["status"] != "ok"
    )
    labels: dict[str, Counter[str]] = defaultdict(Counter)
    for r in records.values():
        if r["status"] == "ok":
            key = f"c{r['consistency']}e{r['effectiveness']}"
            labels[r["source"]][key] += 1
            labels["all"][key] += 1
    return {
        "transitions": total,
        "annotated_ok": status["ok"],
        "rejected": status["rejected"],
        "unannotated": total - len(records),
        "this_run": dict(now),
        "reject_reasons": dict(reasons),
        "verdicts_by_source": {k: dict(v) for k, v in sorted(labels.items())},
        "expert": dict(expert_stats),
        "errors": errors[:20],
    }


def run(cfg: PipelineConfig) -> dict[str, Any]:
    from workflows.common.pipeline import write_json

    t0 = time.time()
    summary = asyncio.run(annotate(cfg))
    summary["elapsed_s"] = time.time() - t0
    write_json(cfg.run_dir / SUMMARY_FILE, summary)
    print(format_summary(summary), flush=True)
    return summary


def format_summary(s: dict[str, Any]) -> str:
    lines = [
        f"[annotate] {s['transitions']} transitions: {s['annotated_ok']} annotated, "
        f"{s['rejected']} rejected, {s['unannotated']} left; this run {s['this_run']}",
        f"[annotate] reject reasons: {s['reject_reasons'] or 'none'}",
    ]
    for source, counts in s["verdicts_by_source"].items():
        lines.append(f"[annotate] verdicts {source:<9} {dict(sorted(counts.items()))}")
    lines += [f"[annotate] error: {e}" for e in s["errors"][:5]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parsed = parse_cli("python -m workflows.analyzer.annotate", __doc__, argv)
    if isinstance(parsed, int):
        return parsed
    summary = run(parsed[0])
    return 1 if summary["this_run"].get("errors") else 0


if __name__ == "__main__":
    sys.exit(main())
