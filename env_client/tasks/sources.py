"""Task sources: where a job's task payloads come from, and how one becomes an episode's instance.

Two sources, one interface (:class:`TaskSource`):

- ``miniwob``: the embedded MiniWoB++ task list (``miniwob.yaml`` or another file of the same
  schema). A payload is ``{"id", "instruction", "env": "miniwob", "task", "seed", "kind"}``;
  each visit of a task draws a new problem by rewriting ``seed``.
- ``osworld``: OSWorld's own task files, a folder of ``<domain>/<id>.json`` task configs and, per
  split, an index file ``{"<domain>": ["<id>", ...]}`` (OSWorld's ``test_all.json`` format). A
  payload is the task JSON as OSWorld's service expects it (``id``, ``instruction``, ``config``,
  ``evaluator``, …, passed through unchanged) plus ``"env": "osworld"``, ``"task": <id>`` and
  ``"kind": <domain>`` (per-domain success rates). An instance is the task itself: OSWorld
  tasks are deterministic set-ups, so a revisit replays the same task.

A file that does not validate raises :class:`TaskFileError` naming the file and the field.
Pydantic and the standard library only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class TaskFileError(ValueError):
    """A task file or split index that does not validate; the message names file and field."""


class TaskSourceConfig(BaseModel):
    """Which tasks a job plays (``task_source`` in the job configs)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["miniwob", "osworld"] = Field(
        "miniwob", description="miniwob: the embedded MiniWoB++ list; osworld: OSWorld task files."
    )
    path: str | None = Field(
        None,
        description="miniwob: a task list YAML (None: env_client/tasks/miniwob.yaml); osworld: "
        "the folder of <domain>/<id>.json task configs (OSWorld's evaluation_examples/examples).",
    )
    splits: dict[str, str] = Field(
        default_factory=dict,
        description="osworld: split name -> index JSON {domain: [ids]} (absolute, or relative to "
        "`path`), e.g. {train: ../train_nochrome.json, eval: ../test_all.json}.",
    )
    domains: list[str] | None = Field(
        None, min_length=1, description="osworld: only these domains (None: all in the index)."
    )

    @model_validator(mode="after")
    def _complete(self) -> TaskSourceConfig:
        if self.kind == "osworld":
            if not self.path:
                raise ValueError("task_source.path: required for kind 'osworld' (the task folder)")
            if not self.splits:
                raise ValueError(
                    "task_source.splits: required for kind 'osworld' (split -> index JSON)"
                )
        elif self.splits or self.domains:
            raise ValueError("task_source.splits/domains: only for kind 'osworld'")
        return self


class TaskSource(Protocol):
    """Task payloads of a split, and the instance an episode group plays."""

    kind: str

    def tasks(self, split: str) -> list[dict[str, Any]]:
        """Payloads of ``split``, each with ``task`` (name) and ``kind`` (family/domain)."""
        ...

    def instance(self, task: dict[str, Any], seq: int) -> dict[str, Any]:
        """The payload group number ``seq`` plays (all G episodes of a group share it)."""
        ...


class MiniWoBSource:
    """The embedded list; a new MiniWoB problem per visit (the seed is rewritten)."""

    kind = "miniwob"

    def __init__(self, path: str | None = None) -> None:
        self.path = path

    def tasks(self, split: str) -> list[dict[str, Any]]:
        from env_client.tasks import DEFAULT_TASKS, load_tasks

        return load_tasks(split, self.path or DEFAULT_TASKS)

    def instance(self, task: dict[str, Any], seq: int) -> dict[str, Any]:
        return task_instance(task, seq)


class OSWorldTask(BaseModel):
    """The fields of an OSWorld task config that a run depends on; the rest pass through."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(min_length=1)
    instruction: str = Field(min_length=1)
    config: list[dict[str, Any]] = Field(default_factory=list)
    evaluator: dict[str, Any]

    @field_validator("config")
    @classmethod
    def _steps_typed(cls, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, step in enumerate(steps):
            if not isinstance(step.get("type"), str):
                raise ValueError(f"step {i} has no string 'type'")
        return steps

    @field_validator("evaluator")
    @classmethod
    def _has_func(cls, evaluator: dict[str, Any]) -> dict[str, Any]:
        func = evaluator.get("func")
        ok = isinstance(func, str) or (
            isinstance(func, list) and all(isinstance(f, str) for f in func)
        )
        if not ok or not func:
            raise ValueError("'func' must be a metric name or a list of them")
        return evaluator


class OSWorldSource:
    """OSWorld task files: ``<path>/<domain>/<id>.json`` and a split index per split."""

    kind = "osworld"

    def __init__(self, cfg: TaskSourceConfig) -> None:
        assert cfg.path is not None  # the config validator requires it
        self.root = Path(cfg.path).expanduser()
        self.cfg = cfg
        self._loaded: dict[str, list[dict[str, Any]]] = {}
        if not self.root.is_dir():
            raise TaskFileError(f"{self.root}: task_source.path is not a folder")

    def tasks(self, split: str) -> list[dict[str, Any]]:
        return list(self._loaded[split]) if split in self._loaded else self._load_split(split)

    def _load_split(self, split: str) -> list[dict[str, Any]]:
        if split not in self.cfg.splits:
            raise KeyError(
                f"task_source.splits has no split {split!r}; have {sorted(self.cfg.splits)}"
            )
        index_path = self._index_path(self.cfg.splits[split])
        index = _read_index(index_path)
        domains = self.cfg.domains or sorted(index)
        missing = sorted(set(domains) - set(index))
        if missing:
            raise TaskFileError(f"{index_path}: no domain(s) {missing} (task_source.domains)")
        payloads = [
            self._payload(domain, task_id) for domain in domains for task_id in index[domain]
        ]
        if not payloads:
            raise TaskFileError(f"{index_path}: split {split!r} lists no tasks")
        self._loaded[split] = payloads
        return list(payloads)

    def _index_path(self, given: str) -> Path:
        p = Path(given).expanduser()
        return p if p.is_absolute() else self.root / p

    def _payload(self, domain: str, task_id: str) -> dict[str, Any]:
        path = self.root / domain / f"{task_id}.json"
        task = load_osworld_task(path)
        if task["id"] != task_id:
            raise TaskFileError(f"{path}: field 'id' is {task['id']!r}, the index says {task_id!r}")
        return {**task, "env": "osworld", "task": task_id, "kind": domain}

    def instance(self, task: dict[str, Any], seq: int) -> dict[str, Any]:
        return task_instance(task, seq)


def task_instance(task: dict[str, Any], seq: int) -> dict[str, Any]:
    """The payload group ``seq`` plays, from the payload alone (rollout workers may run where
    the task files are not): MiniWoB draws one problem per group (same seed for all G
    episodes) and a new one per visit, the multiplier keeping two tasks' seed sequences
    apart; an OSWorld task is its own instance."""
    if task.get("env") == "miniwob":
        return {**task, "seed": int(task.get("seed", 0)) * 100_003 + seq}
    return dict(task)


def load_osworld_task(path: Path) -> dict[str, Any]:
    """One OSWorld task config, validated; the JSON object unchanged."""
    raw = _read_json(path, "task file")
    if not isinstance(raw, dict):
        raise TaskFileError(
            f"{path}: a task config must be a JSON object, got {type(raw).__name__}"
        )
    try:
        OSWorldTask.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "(root)"
        raise TaskFileError(f"{path}: field {field!r}: {err['msg']}") from None
    return raw


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise TaskFileError(f"{path}: {what} not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TaskFileError(f"{path}: not valid JSON ({exc})") from None


def _read_index(path: Path) -> dict[str, list[str]]:
    raw = _read_json(path, "split index")
    if not isinstance(raw, dict):
        raise TaskFileError(f"{path}: a split index must map domain -> [task ids]")
    for domain, ids in raw.items():
        if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids):
            raise TaskFileError(f"{path}: field {domain!r} must be a list of task id strings")
    return raw


def make_task_source(cfg: TaskSourceConfig) -> TaskSource:
    """The configured source (files are read on first use of a split)."""
    if cfg.kind == "osworld":
        return OSWorldSource(cfg)
    return MiniWoBSource(cfg.path)
