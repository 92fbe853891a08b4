"""Task lists of the embedded environment.

``load_tasks("train")`` → task payloads ``{"id", "instruction", "env", "task", "seed", "kind"}``
(``kind``: the task family, for per-domain success rates), from ``miniwob.yaml`` beside this
file or another list of the same schema.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from env_client.config import TaskListConfig

DEFAULT_TASKS = Path(__file__).with_name("miniwob.yaml")


@lru_cache(maxsize=8)
def load_task_list(path: str | Path = DEFAULT_TASKS) -> TaskListConfig:
    """The validated task list file."""
    with open(path) as f:
        return TaskListConfig.model_validate(yaml.safe_load(f))


def load_tasks(split: str, path: str | Path = DEFAULT_TASKS) -> list[dict[str, Any]]:
    """Task payloads of one split, ordered by task then seed."""
    tasks = load_task_list(path)
    if split not in tasks.splits:
        raise KeyError(f"no split {split!r} in {path}; have {sorted(tasks.splits)}")
    spec = tasks.splits[split]
    seeds = range(spec.seeds.start, spec.seeds.start + spec.seeds.count)
    return [
        {
            "id": f"{tasks.env}/{name}/{seed}",
            "instruction": tasks.tasks[name].description,
            "env": tasks.env,
            "task": name,
            "seed": seed,
            "kind": tasks.tasks[name].kind,
        }
        for name in spec.tasks
        for seed in seeds
    ]
