"""Step metrics: combined across ranks, staleness of samples, and the files they are logged to.

Keys are namespaced (``loss/…``, ``sd/…``, ``pg/…``, ``policy/…``, ``train/…``,
``staleness/…``, ``time/…``) plus the plain ``tokens`` and ``step_time``. Per-micro-batch means
are averaged; counts are summed over ranks; ``*/max`` keys take the maximum over ranks.

The rank-0 worker appends one JSON object per optimizer step to
``<run_dir>/train_metrics.jsonl`` (the step's metrics plus ``time``, ``run`` and ``kind``), so
its last line is always the latest step; drivers tail it for progress. Lifecycle events
(``start`` with what was restored, ``checkpoint``, ``end`` with the reason) go to
``<run_dir>/train_events.jsonl`` (both through :class:`train_loops.jsonl.JsonlWriter`). The same
step metrics go to ``ray.train.report``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

METRICS_FILE = "train_metrics.jsonl"
EVENTS_FILE = "train_events.jsonl"


def mean_of(dicts: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Key-wise mean of equally keyed dicts (e.g. one per micro-batch)."""
    if not dicts:
        return {}
    return {k: sum(d[k] for d in dicts) / len(dicts) for k in dicts[0]}


def staleness(rows: Iterable[Mapping[str, Any]], version: int) -> dict[str, float]:
    """``version - behavior_version`` of the rows: mean and max; empty if rows lack the field."""
    lags = [version - int(r["behavior_version"]) for r in rows if "behavior_version" in r]
    if not lags:
        return {}
    return {"staleness/mean": sum(lags) / len(lags), "staleness/max": float(max(lags))}


def reduce_across_ranks(
    means: Mapping[str, float],
    sums: Mapping[str, float],
    device: torch.device | str,
) -> dict[str, float]:
    """Mean of ``means`` and sum of ``sums`` over ranks; keys ending in ``/max`` take the max.

    Every rank must pass the same keys (a collective); without torch.distributed it is the
    identity.
    """
    out = {**means, **sums}
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return out
    world = dist.get_world_size()
    max_keys = sorted(k for k in means if k.endswith("/max"))
    avg_keys = sorted(k for k in means if k not in max_keys)
    sum_keys = sorted(sums)
    values = [means[k] for k in avg_keys] + [sums[k] for k in sum_keys]
    summed = _all_reduce(values, dist.ReduceOp.SUM, device)
    for i, k in enumerate(avg_keys):
        out[k] = summed[i] / world
    for i, k in enumerate(sum_keys):
        out[k] = summed[len(avg_keys) + i]
    maxima = _all_reduce([means[k] for k in max_keys], dist.ReduceOp.MAX, device)
    out.update(zip(max_keys, maxima, strict=True))
    return out


def _all_reduce(values: list[float], op: Any, device: torch.device | str) -> list[float]:
    if not values:
        return []
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op)
    return t.tolist()
