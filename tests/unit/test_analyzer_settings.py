"""``benchmarks/analyzer_settings.py``'s input checks: arms are analyzer settings only, and an
arm can add episodes to a build's data but never leave some out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.analyzer_settings import arm_name, arm_overrides, fewer_than_built, main


class _Refused(Exception):
    pass


def _error(message: str) -> None:
    raise _Refused(message)


def _build(tmp_path: Path, seeds: int = 8) -> Path:
    folder = tmp_path / "warm-0-abc"
    folder.mkdir()
    analyzer = {"seeds_per_task": seeds, "policy_episodes": 2, "expert_episodes": 1,
                "wrong_episodes": 1, "epochs": 6.0}  # fmt: skip
    (folder / "warm_start.json").write_text(json.dumps({"config": {"analyzer": analyzer}}))
    return folder


def test_arms_are_analyzer_settings_checked_against_the_config() -> None:
    assert arm_overrides("analyzer.epochs=12 analyzer.lr=2e-3", _error) == [
        "analyzer.epochs=12", "analyzer.lr=2e-3",
    ]  # fmt: skip
    assert arm_overrides("", _error) == []
    with pytest.raises(_Refused, match=r"'bc\.steps=10' is not analyzer"):
        arm_overrides("bc.steps=10", _error)
    with pytest.raises(_Refused, match=r"analyzer\.epochs = -1"):
        arm_overrides("analyzer.epochs=-1", _error)
    with pytest.raises(_Refused, match="unknown field"):
        arm_overrides("analyzer.nope=1", _error)
    assert arm_name(["analyzer.seeds_per_task=24", "analyzer.epochs=2"]) == (
        "seeds_per_task=24_epochs=2"
    )
    assert arm_name([]) == "default"


def test_an_arm_may_add_episodes_but_not_leave_the_builds_out(tmp_path: Path) -> None:
    warm = _build(tmp_path)
    assert fewer_than_built(warm, ["analyzer.seeds_per_task=24"]) == []
    assert fewer_than_built(warm, ["analyzer.epochs=12"]) == []
    assert fewer_than_built(warm, ["analyzer.seeds_per_task=4", "analyzer.wrong_episodes=0"]) == [
        "analyzer.seeds_per_task=4 < 8", "analyzer.wrong_episodes=0 < 1",
    ]  # fmt: skip


def test_bad_builds_and_arms_stop_before_anything_runs(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    assert main(["--warm", str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert "no warm_start.json" in capsys.readouterr().err
    warm = _build(tmp_path)
    assert main(["--warm", str(warm), "--arm", "analyzer.seeds_per_task=2", "--out", str(out)]) == 2
    assert "analyzer.seeds_per_task=2 < 8" in capsys.readouterr().err
    assert not out.exists()
