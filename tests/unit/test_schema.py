"""Step-sample schema: validation and a Parquet round trip."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from train_loops.schema import (
    STEP_SAMPLE_SCHEMA,
    SampleError,
    read_parquet,
    to_table,
    validate_sample,
    write_parquet,
)


def _png(color: tuple[int, int, int]) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (16, 21), color).save(buf, format="PNG")
    return buf.getvalue()


def make_row(i: int = 0, n: int = 3) -> dict:
    return {
        "sample_id": f"s{i}",
        "task_id": "click-button",
        "group_id": "g0",
        "episode_id": f"e{i}",
        "step_index": i,
        "num_steps": 2,
        "prompt_ids": [1, 2, 3, 4],
        "response_ids": list(range(10, 10 + n)),
        "behavior_logprobs": [-0.5] * n,
        "ordinary_logprobs": [-0.4] * n,
        "privileged_logprobs": [-0.25] * n,
        "screenshots": [_png((255, 0, 0)), _png((0, 0, 255))],
        "response_text": "Action: click.",
        "action": '{"action": "left_click", "coordinate": [1, 2]}',
        "score": 1.0,
        "reward": 1.0,
        "advantage": 0.75,
        "consistency": 1,
        "effectiveness": None,
        "guide": "click OK",
        "avoid": "",
        "d": 0,
        "v": 0.5,
        "behavior_version": 3,
        "privileged_version": 4,
        "t_generate_s": 0.1,
        "t_env_s": 0.2,
        "t_analyze_s": 0.3,
        "t_score_s": 0.05,
        "created_at": 1.0e9,
    }


def test_parquet_round_trip(tmp_path: Path) -> None:
    rows = [make_row(0), make_row(1, n=5)]
    path = write_parquet(rows, tmp_path / "shard.parquet")
    back = read_parquet(path)
    assert len(back) == 2
    for a, b in zip(rows, back, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            if isinstance(a[k], float) or (
                isinstance(a[k], list) and a[k] and isinstance(a[k][0], float)
            ):
                assert b[k] == pytest.approx(a[k]), k
            else:
                assert a[k] == b[k], k
    assert to_table(rows).schema.equals(STEP_SAMPLE_SCHEMA)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"privileged_logprobs": [-1.0]}, "privileged_logprobs has 1 entries"),
        ({"d": 2}, "d=2"),
        ({"v": 1.5}, "v=1.5"),
        ({"bogus": 1}, "unknown fields"),
    ],
)
def test_invalid_samples_name_the_field(change: dict, message: str) -> None:
    row = make_row() | change
    with pytest.raises(SampleError, match=message):
        validate_sample(row)


def test_missing_field_is_named() -> None:
    row = make_row()
    del row["advantage"]
    with pytest.raises(SampleError, match="advantage"):
        validate_sample(row)
