"""The jobs on real desktops, by config: `collect` stores expert episodes on the built-in
OSWorld-format tasks; `evaluate` scores a policy checkpoint and the reference expert there;
the online job (`--config embedded_desktop`) trains two RL steps on desktop episodes. Each
uses the embedded server's desktop backend (Xvfb, openbox, real apps) and releases every
desktop.

Skips (with the reason) where the desktop's programs are not installed
(``bash scripts/setup_desktop.sh``).
"""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from env_client.desktop.config import DesktopConfig
from env_client.desktop.experts import BUILTIN_ROOT
from env_client.desktop.local import missing_binaries
from train_loops.jsonl import read_jsonl
from train_loops.schema import read_parquet
from workflows.common.config_io import load_config
from workflows.common.pipeline_config import PipelineConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

_missing = missing_binaries(DesktopConfig()) + [
    a for a in ("xterm", "mousepad", "soffice") if shutil.which(a) is None
]
if _missing:
    pytest.skip(f"desktop programs not installed ({_missing}): run scripts/setup_desktop.sh",
                allow_module_level=True)  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def desktops_root() -> Iterator[Path]:
    # Not under pytest's tmp_path: a root server's desktop users must be able to enter it.
    root = Path(tempfile.mkdtemp(prefix="csd-test-desktops-"))
    root.chmod(0o711)
    try:
        yield root
    finally:
        assert not [p for p in root.iterdir() if p.name.startswith("desk-")]  # all released
        shutil.rmtree(root, ignore_errors=True)


def _desktop_overrides(root: Path) -> list[str]:
    return [
        "env.embedded.backend=desktop", f"env.embedded.desktop.root={root}",
        "env.embedded.capacity=2", "env.embedded.prewarm=1",
        "task_source.kind=osworld", f"task_source.path={BUILTIN_ROOT}",
        "task_source.splits={train: train.json, eval: eval.json}",
    ]  # fmt: skip


def test_collect_stores_expert_episodes_on_desktops(tmp_path: Path, desktops_root: Path) -> None:
    from workflows.analyzer import collect
    from workflows.analyzer.transitions import read_transitions

    cfg = load_config(PipelineConfig, "analyzer_pipeline", [
        f"runs_dir={tmp_path}", "run_name=desk", *_desktop_overrides(desktops_root),
        "collect.tasks=[te-new-file, calc-delete-row]", "collect.policy_episodes=0",
        "collect.expert_episodes=1", "collect.wrong_episodes=0", "collect.mismatch_episodes=0",
        "collect.max_steps=12", "collect.concurrency=2", "policy.agent_style=toolcall",
    ])  # fmt: skip
    summary = collect.run(cfg)

    expert = summary["by_source"]["expert"]
    assert expert["episodes"] == 2 and expert["success_rate"] == 1.0, summary
    rows = read_transitions(cfg.run_dir / collect.TRANSITIONS_DIR)
    by_task = {r["task_name"] for r in rows}
    assert by_task == {"te-new-file", "calc-delete-row"}
    assert all(r["executed"] and r["screenshot_before"] and r["truth_before"] is None for r in rows)
    assert all("<tool_call>" in r["response_text"] for r in rows)  # the policy's answer format
    assert len([r for r in rows if r["task_name"] == "calc-delete-row"]) == 7


def test_evaluate_scores_a_checkpoint_and_the_expert_on_desktops(
    tmp_path: Path, desktops_root: Path, ray_cluster
) -> None:
    from workflows.evaluation import evaluate

    cfg = load_config(PipelineConfig, "analyzer_pipeline", [
        f"runs_dir={tmp_path}", "run_name=ev", f"serve_http_port={_free_port()}",
        *_desktop_overrides(desktops_root), "policy.num_cpus=0.25", "policy.agent_style=toolcall",
        "evaluate.checkpoints=[{name: base, path: 'tiny:0'}]",
        "evaluate.tasks=[os-make-executable, te-title-upper]", "evaluate.runs=1",
        "evaluate.max_steps=8", "evaluate.reference_expert=true",
    ])  # fmt: skip
    report = evaluate.run(cfg)

    outcomes = json.loads((cfg.run_dir / "eval" / "report.json").read_text())["outcomes"]
    assert len(outcomes) == 2 * 2 and all(o["error"] is None for o in outcomes), outcomes
    assert report["overall"][evaluate.EXPERT]["runs"] == [1.0]  # the harness scores right
    assert report["overall"]["base"]["episodes"] == 2
    assert set(report["by_kind"]) == {"os", "text_editor"}


def test_online_job_trains_on_desktop_episodes(
    tmp_path: Path, desktops_root: Path, ray_cluster
) -> None:
    from workflows.online_rl import job
    from workflows.online_rl.config import OnlineRLConfig

    cfg = load_config(OnlineRLConfig, "embedded_desktop", [
        f"runs_dir={tmp_path}", "run_name=desk-rl", f"serve_http_port={_free_port()}",
        f"env.embedded.desktop.root={desktops_root}", "env.embedded.prewarm=1",
        "rollout.tasks=[os-make-folder, te-append-line]", "rollout.max_steps=3",
        "trainer.max_steps=2", "trainer.checkpoint_every=2", "trainer.cpus_per_worker=0.5",
        "progress_every_s=5",
    ])  # fmt: skip
    job.run(cfg)

    steps = [r for r in read_jsonl(cfg.run_dir / "train_metrics.jsonl") if "loss/pg" in r]
    assert len(steps) == 2
    ledger = list(read_jsonl(cfg.run_dir / "trajectories" / "ledger.jsonl"))
    assert [r for r in ledger if r.get("ev") == "trained"]
    shards = list((cfg.run_dir / "trajectories").glob("*/*.parquet"))
    tasks = {r["task_id"] for shard in shards for r in read_parquet(shard)}
    assert tasks and tasks <= {"os-make-folder", "te-append-line"}, tasks
