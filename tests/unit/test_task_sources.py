"""Task sources: the embedded MiniWoB++ list and OSWorld task files (written by the tests)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from env_client.tasks.sources import (
    TaskFileError,
    TaskSourceConfig,
    make_task_source,
    task_instance,
)


def osworld_task(task_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": task_id,
        "snapshot": "libreoffice_calc",
        "instruction": f"Do task {task_id}.",
        "source": "test",
        "config": [{"type": "launch", "parameters": {"command": ["libreoffice", "--calc"]}}],
        "evaluator": {"func": "compare_table", "result": {"type": "vm_file"}},
        **extra,
    }


def write_tree(root: Path, tasks: dict[str, list[dict[str, Any]]]) -> Path:
    examples = root / "examples"
    for domain, items in tasks.items():
        (examples / domain).mkdir(parents=True, exist_ok=True)
        for t in items:
            (examples / domain / f"{t['id']}.json").write_text(json.dumps(t))
    index = {domain: [t["id"] for t in items] for domain, items in tasks.items()}
    (root / "test_all.json").write_text(json.dumps(index))
    return examples


def source_for(examples: Path, **kw: Any):
    cfg = TaskSourceConfig(
        kind="osworld", path=str(examples), splits={"eval": "../test_all.json"}, **kw
    )
    return make_task_source(cfg)


def test_osworld_payloads_are_the_task_json_with_domain(tmp_path: Path) -> None:
    examples = write_tree(
        tmp_path,
        {"libreoffice_calc": [osworld_task("a1"), osworld_task("a2")], "os": [osworld_task("b1")]},
    )
    tasks = source_for(examples).tasks("eval")
    assert [(t["kind"], t["task"]) for t in tasks] == [
        ("libreoffice_calc", "a1"), ("libreoffice_calc", "a2"), ("os", "b1"),
    ]  # fmt: skip
    first = tasks[0]
    assert first["env"] == "osworld" and first["snapshot"] == "libreoffice_calc"
    assert first["config"][0]["type"] == "launch" and first["evaluator"]["func"] == "compare_table"
    # An OSWorld task is its own instance: revisits replay it, no seed is invented.
    assert task_instance(first, 7) == first and "seed" not in task_instance(first, 7)
    only_os = source_for(examples, domains=["os"]).tasks("eval")
    assert [t["id"] for t in only_os] == ["b1"]


def test_miniwob_source_draws_a_new_problem_per_visit() -> None:
    src = make_task_source(TaskSourceConfig())
    tasks = src.tasks("train")
    t = tasks[0]
    assert t["env"] == "miniwob" and {"task", "seed", "kind", "instruction"} <= set(t)
    assert src.instance(t, 1)["seed"] != src.instance(t, 2)["seed"]
    assert src.instance(t, 1) == src.instance(t, 1)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda t: t.pop("instruction"), "field 'instruction'"),
        (lambda t: t.update(instruction=""), "field 'instruction'"),
        (lambda t: t.update(evaluator={"result": {}}), "field 'evaluator'"),
        (lambda t: t.update(config=[{"parameters": {}}]), "field 'config'"),
        (lambda t: t.update(id="other"), "field 'id' is 'other'"),
    ],
)
def test_bad_task_file_names_file_and_field(tmp_path: Path, mutate, message: str) -> None:
    task = osworld_task("t1")
    mutate(task)
    examples = write_tree(tmp_path, {"os": [{**task, "id": task.get("id", "t1")}]})
    bad = examples / "os" / "t1.json"
    if task.get("id") == "other":  # the file is named by the index id, its content disagrees
        (examples / "os" / "other.json").rename(bad)
        (tmp_path / "test_all.json").write_text(json.dumps({"os": ["t1"]}))
    with pytest.raises(TaskFileError, match=message) as err:
        source_for(examples).tasks("eval")
    assert str(bad) in str(err.value)


def test_missing_files_and_bad_index_are_named(tmp_path: Path) -> None:
    examples = write_tree(tmp_path, {"os": [osworld_task("t1")]})
    (tmp_path / "test_all.json").write_text(json.dumps({"os": ["t1", "gone"]}))
    with pytest.raises(TaskFileError, match=r"gone\.json: task file not found"):
        source_for(examples).tasks("eval")
    (tmp_path / "test_all.json").write_text(json.dumps({"os": "t1"}))
    with pytest.raises(TaskFileError, match=r"test_all\.json: field 'os' must be a list"):
        source_for(examples).tasks("eval")
    (tmp_path / "test_all.json").write_text("{not json")
    with pytest.raises(TaskFileError, match="not valid JSON"):
        source_for(examples).tasks("eval")
    with pytest.raises(TaskFileError, match=r"no domain\(s\) \['chrome'\]"):
        (tmp_path / "test_all.json").write_text(json.dumps({"os": ["t1"]}))
        source_for(examples, domains=["chrome"]).tasks("eval")
    with pytest.raises(KeyError, match="no split 'train'"):
        source_for(examples).tasks("train")
    with pytest.raises(TaskFileError, match="is not a folder"):
        source_for(tmp_path / "nowhere")


def test_config_requires_osworld_fields() -> None:
    with pytest.raises(ValidationError, match=r"task_source\.path: required"):
        TaskSourceConfig(kind="osworld", splits={"eval": "x.json"})
    with pytest.raises(ValidationError, match=r"task_source\.splits: required"):
        TaskSourceConfig(kind="osworld", path="/tasks")
    with pytest.raises(ValidationError, match="only for kind 'osworld'"):
        TaskSourceConfig(splits={"eval": "x.json"})


def test_job_config_refuses_osworld_tasks_on_the_embedded_server() -> None:
    from workflows.common.config_io import ConfigError, load_config
    from workflows.online_rl.config import OnlineRLConfig

    with pytest.raises(ConfigError, match=r"needs env\.server_url"):
        load_config(OnlineRLConfig, "embedded", [
            "task_source.kind=osworld", "task_source.path=/tasks",
            "task_source.splits={train: t.json}",
        ])  # fmt: skip
