"""The built-in desktop task set and the task-format checks (no desktop needed)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from env_client.desktop.experts import BUILTIN_ROOT, _experts, builtin_tasks, expert_steps
from env_client.desktop.tasks import check_task, load_task
from env_client.tasks.sources import TaskFileError

DOMAINS = {"os", "text_editor", "libreoffice_calc", "libreoffice_writer"}


def test_builtin_set_has_enough_tasks_domains_and_disjoint_splits() -> None:
    train, evals = builtin_tasks("train"), builtin_tasks("eval")
    ids_train = {t["task"] for t in train}
    ids_eval = {t["task"] for t in evals}
    assert len(ids_train | ids_eval) >= 24
    assert not ids_train & ids_eval
    assert {t["kind"] for t in train} == DOMAINS == {t["kind"] for t in evals}
    on_disk = {p.stem for d in DOMAINS for p in (BUILTIN_ROOT / d).glob("*.json")}
    assert on_disk == ids_train | ids_eval


def test_every_task_has_an_expert_ending_in_a_control_action() -> None:
    experts = expert_steps()
    tasks = builtin_tasks("train") + builtin_tasks("eval")
    assert set(experts) == {t["task"] for t in tasks}
    for task in tasks:
        last = experts[task["task"]][-1]["action"]
        want = "FAIL" if task["evaluator"]["func"] == "infeasible" else "DONE"
        assert last == {"kind": "control", "type": want, "payload": {}}, task["task"]


def test_every_local_file_a_task_names_exists() -> None:
    for task in builtin_tasks("train") + builtin_tasks("eval"):
        text = json.dumps(task)
        for part in text.split('"')[1::2]:
            if part.startswith("files/"):
                assert (BUILTIN_ROOT / part).is_file(), (task["task"], part)


def _task() -> dict[str, Any]:
    return copy.deepcopy(load_task(BUILTIN_ROOT / "os" / "os-rename-file.json"))


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda t: t.pop("instruction"), "'instruction'"),
        (lambda t: t["config"].append({"type": "teleport"}), "'config[3].type'"),
        (
            lambda t: t["config"].append({"type": "sleep", "parameters": {}}),
            "config[3].parameters.seconds",
        ),
        (
            lambda t: t["config"].append({"type": "sleep", "parameters": {"seconds": 1e9}}),
            "seconds",
        ),
        (
            lambda t: t["config"].append({"type": "open", "parameters": {"path": 3}}),
            "parameters.path",
        ),
        (lambda t: t["config"][0].update(extra=1), "'config[0]'"),
        (lambda t: t["evaluator"].update(func="compare_magic"), "'evaluator.func[0]'"),
        (lambda t: t["evaluator"]["result"].update(type="cloud_file"), "evaluator.result[0].type"),
        (lambda t: t["evaluator"].pop("result"), "'evaluator.result'"),
        (lambda t: t["evaluator"].update(conj="xor"), "evaluator.conj"),
        (
            lambda t: t["evaluator"].update(postconfig=[{"type": "nap"}]),
            "evaluator.postconfig[0].type",
        ),
        (lambda t: t["evaluator"].update(func=["exact_match", "exact_match"]), "evaluator.result"),
    ],
)
def test_bad_task_json_names_the_file_and_field(tmp_path: Path, edit: Any, field: str) -> None:
    task = _task()
    edit(task)
    path = tmp_path / "os" / "bad.json"
    path.parent.mkdir()
    path.write_text(json.dumps(task))
    with pytest.raises(TaskFileError) as err:
        load_task(path)
    assert str(path) in str(err.value)
    assert field in str(err.value)


def test_payload_checks_name_task_payload() -> None:
    with pytest.raises(TaskFileError, match="task_payload: a task must be a JSON object"):
        check_task([1, 2])
    task = _task()
    task["config"] = "launch everything"
    with pytest.raises(TaskFileError, match="task_payload: field 'config'"):
        check_task(task)


def test_malformed_json_and_experts_files_are_clear_errors(tmp_path: Path) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text("{not json")
    with pytest.raises(TaskFileError, match="not valid JSON"):
        load_task(bad)
    experts = tmp_path / "experts.json"
    experts.write_text(json.dumps({"t": [{"action": {"kind": "gui", "type": "FLY"}}]}))
    with pytest.raises(TaskFileError, match=r"field 't\[0\]\.action'"):
        _experts(experts)
