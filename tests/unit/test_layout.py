"""The package layout's promises (DESIGN.md): dependencies point one way, no import circles,
and the jobs in ``workflows/`` share code only through ``workflows.common``, except the two
edges that are the point: the warm start runs the analyzer pipeline, and the online job and the
demo start from a warm start (``warm:<seed>`` model paths)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("env_client", "serve_apps", "train_loops", "workflows")
JOBS = ("online_rl", "analyzer", "evaluation", "warm_start", "demo")
JOB_EDGES = {("warm_start", "analyzer"), ("online_rl", "warm_start"), ("demo", "warm_start")}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            parts = f.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _imports(path: Path, known: dict[str, Path]) -> set[str]:
    """Modules of ours that ``path`` imports anywhere (top level, functions, TYPE_CHECKING)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found.update(n for n in names if n in known)
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(f, mods) - {m} for m, f in mods.items()}


def _cycle_from(graph: dict[str, set[str]], start: str) -> list[str] | None:
    stack: list[tuple[str, list[str]]] = [(start, [start])]
    seen: set[str] = set()
    while stack:
        node, path = stack.pop()
        for nxt in graph[node]:
            if nxt == start:
                return [*path, start]
            if nxt not in seen and nxt.split(".")[0] == start.split(".")[0]:
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))
    return None


def test_no_import_circles() -> None:
    graph = _graph()
    cycles = [c for m in graph if (c := _cycle_from(graph, m))]
    assert not cycles, f"import circles: {cycles[:3]}"


def test_dependencies_point_one_way() -> None:
    allowed = {
        "env_client": {"env_client"},
        "serve_apps": {"serve_apps", "env_client"},
        "train_loops": {"train_loops", "env_client"},
        "workflows": set(PACKAGES),
    }
    bad = [
        (a, b)
        for a, targets in _graph().items()
        for b in targets
        if b.split(".")[0] not in allowed[a.split(".")[0]]
    ]
    assert not bad, f"imports against the layout: {bad}"


def test_jobs_share_code_only_through_common() -> None:
    def job(m: str) -> str | None:
        parts = m.split(".")
        return parts[1] if len(parts) > 1 and parts[0] == "workflows" and parts[1] in JOBS else None

    bad = [
        (a, b)
        for a, ts in _graph().items()
        for b in ts
        if job(a) and job(b) and job(a) != job(b) and (job(a), job(b)) not in JOB_EDGES
    ]
    assert not bad, f"one job imports another: {bad}"
