"""Which samples a checkpoint's weights were trained on: ``trained_samples_<kind>.jsonl`` (kind
``rl`` or ``sft``) in every checkpoint folder, one line per optimizer step of that kind::

    {"step": 12, "ids": ["g000031-e0-s2", ...]}     # every rank's rows of step 12

A checkpoint copies its predecessor's lines and adds its own steps, so the file of the newest
checkpoint is the whole lineage of its weights: steps that ran after it and were lost with a
crashed worker are not in it. A run of one kind started from another kind's checkpoint (an
Entropulse SFT phase between RL segments) carries that kind's lineage along unchanged. The
trajectory buffer reads the RL lineage to hand out again exactly the rows it lacks, the soak's
audit to prove that no sample was trained twice or lost. Standard library.
"""

from __future__ import annotations

import json
from pathlib import Path

PREFIX = "trained_samples_"


def lineage_file(kind: str) -> str:
    return f"{PREFIX}{kind}.jsonl"


def read_lineages(checkpoint: str | Path | None) -> dict[str, list[dict]]:
    """Every kind's lineage in ``checkpoint`` (none for None or a plain Hugging Face folder)."""
    if checkpoint is None or not Path(checkpoint).is_dir():
        return {}
    out = {}
    for path in sorted(Path(checkpoint).glob(f"{PREFIX}*.jsonl")):
        kind = path.stem[len(PREFIX) :]
        lines = [json.loads(t) for t in path.read_text().splitlines() if t.strip()]
        out[kind] = [{"step": int(r["step"]), "ids": [str(i) for i in r["ids"]]} for r in lines]
    return out


def read_lineage(checkpoint: str | Path | None, kind: str = "rl") -> list[dict]:
    return read_lineages(checkpoint).get(kind, [])


def lineage_ids(lines: list[dict]) -> set[str]:
    return {i for line in lines for i in line["ids"]}


def write_lineages(folder: Path, lineages: dict[str, list[dict]]) -> None:
    for kind, lines in lineages.items():
        with (folder / lineage_file(kind)).open("w") as f:
            for line in lines:
                f.write(json.dumps({"step": line["step"], "ids": line["ids"]}) + "\n")
