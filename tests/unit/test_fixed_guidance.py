"""Fixed guidance files (the authors' GUI_GUIDANCE_FILE format)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workflows.online_rl.fixed_guidance import fixed_judgment, load_guidance, step_guidance


def write(tmp_path: Path, doc: object) -> Path:
    path = tmp_path / "guidance.json"
    path.write_text(json.dumps(doc))
    return path


def test_formats_and_lookup(tmp_path: Path) -> None:
    table = load_guidance(write(tmp_path, {
        "t1": {"steps": ["open the menu", {"step_index": 2, "guidance": " click Save "}]},
        "t2": ["always check the dialog first"],  # trajectory-level: one entry at step 0
    }))  # fmt: skip
    assert step_guidance(table, "t1", 0) == "open the menu"
    assert step_guidance(table, "t1", 1) == "" and step_guidance(table, "t1", 2) == "click Save"
    assert step_guidance(table, "t2", 5) == "always check the dialog first"
    assert step_guidance(table, "unknown", 0) == ""
    listed = load_guidance(write(tmp_path, [{"task_id": "t3", "steps": ["x"]}]))
    assert listed == {"t3": {0: "x"}}


def test_judgment_distils_guided_steps_and_masks_the_rest(tmp_path: Path) -> None:
    table = load_guidance(write(tmp_path, {"t1": ["a", "b"]}))
    assert fixed_judgment(table, "t1", 1) | {} == {
        "consistency": None, "effectiveness": None, "guide": "b", "avoid": "", "d": 1, "v": 0.5,
    }  # fmt: skip
    assert fixed_judgment(table, "t1", 7)["d"] == 0


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"t1": {"steps": "x"}}, "'steps' must be a list"),
        ({"t1": [{"step_index": -1, "guidance": "x"}]}, "invalid or repeated step_index"),
        ({"t1": [{"step_index": 0}, {"step_index": 0}]}, "invalid or repeated"),
        ({"t1": [3]}, "guidance must be a string"),
        ([{"steps": []}], "need 'task_id'"),
        ("text", "task map or a list"),
    ],
)
def test_malformed_files_are_named(tmp_path: Path, doc: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_guidance(write(tmp_path, doc))


def test_missing_file_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"rollout\.fixed_guidance_file: .* not found"):
        load_guidance(tmp_path / "nope.json")
