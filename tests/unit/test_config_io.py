"""Config loading: YAML files, ``key.sub=value`` overrides, and errors that name the field."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field

from workflows.common.config_io import ConfigError, apply_overrides, load_config, parse_override


class Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lr: float = Field(1e-3, gt=0)
    kind: Literal["a", "b"] = "a"


class Outer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = "x"
    inner: Inner = Field(default_factory=Inner)
    tags: list[str] = Field(default_factory=list)


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_file_and_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, "name: run1\ninner:\n  lr: 0.5\n")
    cfg = load_config(Outer, path, ["inner.kind=b", "tags=[x, y]", "inner.lr=2e-5"])
    assert cfg.name == "run1" and cfg.inner.kind == "b" and cfg.tags == ["x", "y"]
    assert cfg.inner.lr == pytest.approx(2e-5)


def test_defaults_without_file() -> None:
    assert load_config(Outer).inner.lr == pytest.approx(1e-3)


@pytest.mark.parametrize(
    ("text", "overrides", "expected"),
    [
        ("inner:\n  lr: -1\n", [], r"inner\.lr = -1: Input should be greater than 0"),
        ("inner:\n  kind: c\n", [], r"inner\.kind = 'c': Input should be 'a' or 'b'"),
        ("inner:\n  lrr: 1\n", [], r"inner\.lrr: unknown field"),
        ("", ["inner.lr=abc"], r"inner\.lr = 'abc'"),
        ("- a\n- b\n", [], "top level must be a mapping"),
        ("a: [\n", [], "not valid YAML"),
    ],
)
def test_bad_config_names_field_value_and_rule(
    tmp_path: Path, text: str, overrides: list[str], expected: str
) -> None:
    with pytest.raises(ConfigError, match=expected) as info:
        load_config(Outer, write(tmp_path, text), overrides)
    assert str(tmp_path / "c.yaml") in str(info.value)


def test_override_syntax_errors() -> None:
    for bad in ("noequals", "=1", "a..b=1"):
        with pytest.raises(ConfigError, match=r"key\.sub=value"):
            parse_override(bad)
    with pytest.raises(ConfigError, match="is a value, not a section"):
        apply_overrides({"name": "x"}, ["name.sub=1"])


def test_missing_file_lists_bundled_configs() -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(Outer, "no-such-config")


def test_environment_references(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "name: ${RUN_NAME_FOR_TEST}-a\n")
    monkeypatch.setenv("RUN_NAME_FOR_TEST", "prod")
    assert load_config(Outer, path).name == "prod-a"
    monkeypatch.delenv("RUN_NAME_FOR_TEST")
    with pytest.raises(ConfigError, match=r"name = '.*RUN_NAME_FOR_TEST.*is not set"):
        load_config(Outer, path)


class Tuned(BaseModel):
    """A section whose default (its factory's) differs from its class's bare defaults."""

    model_config = ConfigDict(extra="forbid")
    inner: Inner = Field(default_factory=lambda: Inner(lr=0.5, kind="b"))
    nested: Outer | None = None


def test_override_inside_an_absent_section_keeps_that_sections_default() -> None:
    cfg = load_config(Tuned, None, ["inner.lr=0.25"])
    assert cfg.inner.lr == 0.25 and cfg.inner.kind == "b"  # not Inner()'s "a"
    cfg = load_config(Tuned, None, ["nested.inner.kind=b"])  # default None: class defaults
    assert cfg.nested is not None and cfg.nested.inner.kind == "b" and cfg.nested.name == "x"


def test_warm_start_trainer_override_keeps_the_cpu_layout() -> None:
    from workflows.warm_start.config import load

    trainer = load(overrides=["bc.trainer.zero_stage=0"]).bc.trainer
    assert (trainer.zero_stage, trainer.num_workers, trainer.use_gpu) == (0, 2, False)
    assert trainer.cpu_autocast == "bf16"
