"""Build (or find) a cached warm start: policy and analyzer for the embedded default.

Stages, each printed as it goes: a fresh tiny checkpoint of the warm architecture →
scripted demonstrations → behaviour cloning (SFT loop) → check (sampled success, guidance
gap) → the analyzer pipeline from the new policy (collect → annotate (oracle) → train) →
report. Everything is written into a sibling ``*.building-<pid>`` folder that is renamed onto
the cache folder only when complete, so a half-built warm start is never loaded; a cache folder
that lost a file is set aside (``*.broken-<time>``) and rebuilt, with a message naming it.

    folder = warm_start(cfg)            # <cache>/warm-<seed>-<digest>/{policy,analyzer}/
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from workflows.warm_start.config import WarmStartConfig

MEMBERS = ("policy", "analyzer")
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json")
STAMP = "warm_start.json"
REPORT = "report.json"


def log(msg: str) -> None:
    print(f"[warm_start] {msg}", flush=True)


def problems(folder: Path) -> list[str]:
    """What a cached warm start lacks (empty: complete and loadable)."""
    out = [] if (folder / STAMP).is_file() else [STAMP]
    for member in MEMBERS:
        out += [f"{member}/{f}" for f in MODEL_FILES if not (folder / member / f).is_file()]
    if not out:
        try:
            json.loads((folder / STAMP).read_text())
            for member in MEMBERS:
                json.loads((folder / member / "config.json").read_text())
        except (OSError, ValueError) as exc:
            out.append(f"unreadable metadata ({exc})")
    return out


def warm_start(cfg: WarmStartConfig, rebuild: bool = False) -> Path:
    """The cache folder of ``cfg``'s warm start, built first if missing or broken."""
    folder = cfg.folder
    if folder.exists() and not rebuild:
        missing = problems(folder)
        if not missing:
            return folder
        aside = folder.with_name(f"{folder.name}.broken-{time.strftime('%Y%m%d-%H%M%S')}")
        log(f"cached warm start {folder} is incomplete ({', '.join(missing[:4])}); "
            f"moving it to {aside} and rebuilding")  # fmt: skip
        folder.rename(aside)
    elif folder.exists():
        shutil.rmtree(folder)
    _sweep_dead_builds(folder)
    work = folder.with_name(f"{folder.name}.building-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    t0 = time.time()
    log(f"building {folder.name} (about 18 minutes on 2 cores; cached afterwards)")
    report = _build_into(cfg, work, t0)
    (work / REPORT).write_text(json.dumps(report, indent=2, default=float))
    stamp = {"digest": cfg.digest(), "config": cfg.model_dump(mode="json"), "built_at": time.time()}
    (work / STAMP).write_text(json.dumps(stamp, indent=2))
    missing = problems(work)
    if missing:
        raise RuntimeError(f"warm start build in {work} is missing {missing}")
    if folder.exists():  # another process finished first: keep its result
        shutil.rmtree(work, ignore_errors=True)
    else:
        work.rename(folder)
    log(f"done in {time.time() - t0:.0f}s: {folder}")
    return folder


def _sweep_dead_builds(folder: Path) -> None:
    """Remove the ``*.building-<pid>`` folders of builds whose process is gone (killed, e.g.
    by the OOM killer): they can never complete, only fill the disk."""
    for stale in folder.parent.glob(f"{folder.name}.building-*"):
        pid = stale.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            log(f"removing {stale} (its build process {pid} is gone)")
            shutil.rmtree(stale, ignore_errors=True)


def warm_member(model_path: str, member: str) -> Path:
    """``warm:<seed>`` → that seed's warm-start ``policy`` or ``analyzer`` folder, with the
    bundled warm_start.yaml (built first when not cached)."""
    from workflows.warm_start.config import WARM_PREFIX, load

    if member not in MEMBERS:
        raise ValueError(f"warm start member {member!r}: allowed {list(MEMBERS)}")
    seed_text = model_path[len(WARM_PREFIX) :] or "0"
    if not seed_text.isdigit():
        raise ValueError(f"model_path {model_path!r}: expected 'warm:<seed>', e.g. 'warm:0'")
    return warm_start(load(overrides=[f"seed={seed_text}"])) / member


def _build_into(cfg: WarmStartConfig, work: Path, t0: float) -> dict[str, Any]:
    import ray

    from workflows.common.pipeline import environment
    from workflows.common.ray_cluster import init_ray, shutdown_ray

    started = not ray.is_initialized()
    init_ray(cfg.ray)
    try:
        with environment(cfg.env, work / "env_server.log") as url:
            env = cfg.env.model_copy(update={"server_url": url})
            report = _policy_stages(cfg, env, work, t0)
            report["analyzer"] = _analyzer_stage(cfg, env, work, t0)
    finally:
        if started:
            shutdown_ray()
    report["elapsed_s"] = time.time() - t0
    return report


def _policy_stages(cfg: WarmStartConfig, env: Any, work: Path, t0: float) -> dict[str, Any]:
    from env_client.tasks import load_task_list, load_tasks
    from serve_apps.prompting.inputs import PromptEncoder
    from workflows.analyzer.train import export_model
    from workflows.common.pipeline import select_tasks
    from workflows.common.tiny_models import build_tiny_checkpoint
    from workflows.warm_start.bc import fit, sft_rows, split_demos
    from workflows.warm_start.demos import collect_demos

    def progress(msg: str) -> None:
        log(f"[{time.time() - t0:.0f}s] {msg}")

    init = build_tiny_checkpoint(work / "init", cfg.model_spec)
    tasks = select_tasks(load_tasks(cfg.demos.split), cfg.tasks, None)
    demo_tasks = select_tasks(tasks, None, cfg.demos.seeds_per_task)  # each task's first seeds
    demos = asyncio.run(collect_demos(cfg.demos, env, demo_tasks, progress))
    train, held = split_demos(demos, cfg.bc.heldout_frac)
    generic = {name: t.description for name, t in load_task_list().tasks.items()}
    rows = sft_rows(train, cfg.bc, PromptEncoder.from_pretrained(init), generic, cfg.seed)
    progress(
        f"behaviour cloning: {len(rows)} samples from {len(train)} states, {cfg.bc.steps} steps"
    )
    checkpoint = fit(cfg.bc, init, rows, work)
    policy = export_model(checkpoint, work / "policy", {"kind": "warm-start policy"})
    shutil.rmtree(work / "init", ignore_errors=True)
    progress("checking the policy: sampled success on training tasks, guidance gap")
    check = _check(cfg, env, policy, tasks, held)
    progress(f"policy: success {check['success']['overall']:.2f} (T={cfg.check.temperature}), "
             f"guidance gap median {check['guidance_gap'].get('median', float('nan')):.2f} nats")  # fmt: skip
    return {"demos": {"states": len(demos), "train": len(train), "heldout": len(held)},
            "bc_samples": len(rows), **check}  # fmt: skip


def _check(
    cfg: WarmStartConfig, env: Any, policy: Path, tasks: list[dict[str, Any]], held: list[Any]
) -> dict[str, Any]:
    from serve_apps.config import PolicyAppConfig, SamplingConfig
    from serve_apps.policy import build_policy_app
    from serve_apps.prompting.inputs import PromptEncoder
    from workflows.common.pipeline import frozen_policy, serve_app, start_serve
    from workflows.warm_start.check import check_tasks, gap_summary, guidance_gaps, success_rates

    base = PolicyAppConfig(
        model_path=str(policy), num_cpus=0.5, agent_style="elements",
        sampling=SamplingConfig(temperature=cfg.check.temperature, max_new_tokens=16),
    )  # fmt: skip
    app = frozen_policy(base, str(policy), "warm-start-check")
    start_serve(8000)
    encoder = PromptEncoder.from_pretrained(policy)
    with serve_app(build_policy_app(app), app.name, app.route_prefix) as handle:
        played = check_tasks(tasks, cfg.check)
        success = asyncio.run(success_rates(env, handle, played, cfg.check, cfg.seed))
        gaps = asyncio.run(guidance_gaps(handle, encoder, held))
    return {"success": success, "guidance_gap": gap_summary(gaps), "gaps": gaps}


def _analyzer_stage(cfg: WarmStartConfig, env: Any, work: Path, t0: float) -> dict[str, Any]:
    from workflows.analyzer import annotate, collect
    from workflows.analyzer import train as train_analyzer
    from workflows.warm_start.pipeline import analyzer_pipeline_config

    pcfg = analyzer_pipeline_config(cfg, env, work)
    log(f"[{time.time() - t0:.0f}s] analyzer: collect → annotate → train from the warm policy")
    collect.run(pcfg)
    annotate.run(pcfg)
    report = train_analyzer.run(pcfg)
    model = pcfg.run_dir / train_analyzer.MODEL_DIR
    shutil.copytree(model, work / "analyzer")
    agreement = report.get("agreement", {})
    acc = agreement.get("accuracy", {})
    base = agreement.get("baseline_majority", {})
    log(f"[{time.time() - t0:.0f}s] analyzer: held-out d {acc.get('d', 0):.3f} "
        f"(majority baseline {base.get('d', 0):.3f})")  # fmt: skip
    return {k: v for k, v in report.items() if k != "trainer_checkpoint"}
