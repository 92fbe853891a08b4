"""The step sample: one executed action of one episode, as the trainer consumes it.

This is the contract between the rollout side (``workflows``), which produces samples, and the
trainer, which reads them from Ray Data or Parquet. Pyarrow only (no torch, no ray) so any
process can read and write it. Field meanings follow ../shared/METHOD.md:

- ``prompt_ids`` is the ordinary context ``c`` exactly as the policy saw it (image pads
  expanded), ``response_ids`` the sampled ``y``: the trainer never re-tokenizes.
- ``behavior_logprobs[t] = log π_behaviour(y_t | c, y_<t)`` from generation;
  ``ordinary_logprobs`` and ``privileged_logprobs`` are the prefill rescoring of ``y`` under ``c``
  and under ``c⁺`` by the same weights (``privileged_version``), so ``T - ordinary`` is the
  guidance's effect measured at one version (rollouts that skip the ordinary rescoring, the
  default, store the behaviour log-probs there). All three have ``len(response_ids)`` entries.
- ``screenshots`` are the PNG images of the context, in prompt order.
- ``d`` ∈ {-1, 0, +1} is the analyzer's direction (0 masks self-distillation), ``v`` its value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

STEP_SAMPLE_SCHEMA = pa.schema(
    [
        pa.field("sample_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("group_id", pa.string(), nullable=False),
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("step_index", pa.int32(), nullable=False),
        pa.field("num_steps", pa.int32(), nullable=False),
        pa.field("prompt_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("response_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("behavior_logprobs", pa.list_(pa.float32()), nullable=False),
        pa.field("ordinary_logprobs", pa.list_(pa.float32()), nullable=False),
        pa.field("privileged_logprobs", pa.list_(pa.float32()), nullable=False),
        pa.field("screenshots", pa.list_(pa.binary()), nullable=False),
        pa.field("response_text", pa.string(), nullable=False),
        pa.field("action", pa.string(), nullable=False),
        pa.field("score", pa.float32(), nullable=False),
        pa.field("reward", pa.float32(), nullable=False),
        pa.field("advantage", pa.float32(), nullable=False),
        pa.field("consistency", pa.int8(), nullable=True),
        pa.field("effectiveness", pa.int8(), nullable=True),
        pa.field("guide", pa.string(), nullable=False),
        pa.field("avoid", pa.string(), nullable=False),
        pa.field("d", pa.int8(), nullable=False),
        pa.field("v", pa.float32(), nullable=False),
        pa.field("behavior_version", pa.int64(), nullable=False),
        pa.field("privileged_version", pa.int64(), nullable=False),
        pa.field("t_generate_s", pa.float32(), nullable=False),
        pa.field("t_env_s", pa.float32(), nullable=False),
        pa.field("t_analyze_s", pa.float32(), nullable=False),
        pa.field("t_score_s", pa.float32(), nullable=False),
        pa.field("created_at", pa.float64(), nullable=False),
    ],
    metadata={"computersd.schema": "step_sample/1"},
)

STEP_SAMPLE_FIELDS: tuple[str, ...] = tuple(STEP_SAMPLE_SCHEMA.names)

# A rollout-batch part (``trainer.schedule: rollout_batch``): the rows one trainer rank takes for
# one optimizer step. The buffer splits each rollout batch into ``world`` parts of equal length
# (padding with zero-weight copies of its rows) and streams rank r's parts to rank r only; these
# transport fields ride along in the stream and are never stored in shards.
# - ``batch_seq``: the rollout batch's number (the same on every rank's part of it);
# - ``batch_real``: real rows of the whole batch, all ranks (an empty batch is never dealt);
# - ``part_rows``: rows of this part, padding included (the same on every rank);
# - ``weight``: 1.0 for a real row, 0.0 for padding.
PART_FIELDS = (
    pa.field("batch_seq", pa.int64(), nullable=False),
    pa.field("batch_real", pa.int32(), nullable=False),
    pa.field("part_rows", pa.int32(), nullable=False),
    pa.field("weight", pa.float32(), nullable=False),
)
STREAM_PART_SCHEMA = pa.schema(
    [*STEP_SAMPLE_SCHEMA, *PART_FIELDS], metadata={"computersd.schema": "step_part/1"}
)


class SampleError(ValueError):
    """A step sample that breaks the schema's invariants; the message names the field."""


def validate_sample(row: Mapping[str, Any]) -> None:
    """Check the invariants pyarrow cannot: field set, per-token lengths, d and v ranges."""
    missing = [f for f in STEP_SAMPLE_FIELDS if f not in row]
    if missing:
        raise SampleError(f"step sample {row.get('sample_id')!r} lacks fields {missing}")
    extra = sorted(set(row) - set(STEP_SAMPLE_FIELDS))
    if extra:
        raise SampleError(f"step sample {row['sample_id']!r} has unknown fields {extra}")
    n = len(row["response_ids"])
    for name in ("behavior_logprobs", "ordinary_logprobs", "privileged_logprobs"):
        if len(row[name]) != n:
            raise SampleError(
                f"step sample {row['sample_id']!r}: {name} has {len(row[name])} entries, "
                f"response_ids has {n}"
            )
    if row["d"] not in (-1, 0, 1):
        raise SampleError(f"step sample {row['sample_id']!r}: d={row['d']!r}, allowed -1, 0, 1")
    if not 0.0 <= float(row["v"]) <= 1.0:
        raise SampleError(f"step sample {row['sample_id']!r}: v={row['v']!r}, allowed [0, 1]")


def to_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """Rows (dicts) → an Arrow table with the step-sample schema, validated."""
    for row in rows:
        validate_sample(row)
    return pa.Table.from_pylist([dict(r) for r in rows], schema=STEP_SAMPLE_SCHEMA)


def write_parquet(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Write rows to one Parquet file atomically (temp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    pq.write_table(to_table(rows), tmp)
    tmp.replace(path)
    return path


def read_parquet(paths: str | Path | Iterable[str | Path]) -> list[dict[str, Any]]:
    """Read one or more step-sample Parquet files back into rows."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    rows: list[dict[str, Any]] = []
    for p in paths:
        table = pq.read_table(p, schema=STEP_SAMPLE_SCHEMA)
        rows.extend(table.to_pylist())
    return rows


# --------------------------------------------------------------------------- SFT samples

# One supervised example: the loss is on ``target_ids`` only.
#
# ``prompt_ids`` is the context exactly as the model will see it (chat template applied, image
# pads expanded by the processor), ``target_ids`` the answer tokens that follow it (including
# the end-of-turn token if the model should learn to stop), ``screenshots`` the context's PNG
# images in prompt order. ``source`` says where the example came from (``"analyzer"``,
# ``"entropulse"``, ...), for bookkeeping only. ``target_weights`` (optional, null: all 1) weighs
# each target token in its sample's mean, e.g. the analyzer's verdict digits over the rest.
SFT_SAMPLE_SCHEMA = pa.schema(
    [
        pa.field("sample_id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("prompt_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("target_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("screenshots", pa.list_(pa.binary()), nullable=False),
        pa.field("target_weights", pa.list_(pa.float32()), nullable=True),
    ],
    metadata={"computersd.schema": "sft_sample/2"},
)

SFT_SAMPLE_FIELDS: tuple[str, ...] = tuple(SFT_SAMPLE_SCHEMA.names)
SFT_OPTIONAL_FIELDS = ("target_weights",)


def validate_sft_sample(row: Mapping[str, Any]) -> None:
    """Check an SFT row: known fields, a non-empty prompt and target, one finite non-negative
    weight per target token (when weights are given) with a positive sum."""
    missing = [f for f in SFT_SAMPLE_FIELDS if f not in row and f not in SFT_OPTIONAL_FIELDS]
    if missing:
        raise SampleError(f"SFT sample {row.get('sample_id')!r} lacks fields {missing}")
    extra = sorted(set(row) - set(SFT_SAMPLE_FIELDS))
    if extra:
        raise SampleError(f"SFT sample {row['sample_id']!r} has unknown fields {extra}")
    for name in ("prompt_ids", "target_ids"):
        if len(row[name]) == 0:
            raise SampleError(f"SFT sample {row['sample_id']!r}: {name} is empty")
    weights = row.get("target_weights")
    if weights is not None:
        if len(weights) != len(row["target_ids"]):
            raise SampleError(
                f"SFT sample {row['sample_id']!r}: target_weights has {len(weights)} values "
                f"for {len(row['target_ids'])} target tokens"
            )
        if not all(0.0 <= w < float("inf") for w in weights) or sum(weights) <= 0:
            raise SampleError(
                f"SFT sample {row['sample_id']!r}: target_weights must be finite, >= 0 and "
                f"not all 0, got {list(weights)[:8]}"
            )


def to_sft_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """SFT rows (dicts) → an Arrow table with the SFT schema, validated."""
    for row in rows:
        validate_sft_sample(row)
    full = [{"target_weights": None, **r} for r in rows]
    return pa.Table.from_pylist(full, schema=SFT_SAMPLE_SCHEMA)


def sft_sample_from_step(row: Mapping[str, Any], source: str = "entropulse") -> dict[str, Any]:
    """A step sample as an SFT example (Entropulse: imitate what the policy did on successes)."""
    return {
        "sample_id": row["sample_id"],
        "source": source,
        "prompt_ids": list(row["prompt_ids"]),
        "target_ids": list(row["response_ids"]),
        "screenshots": list(row["screenshots"]),
    }
