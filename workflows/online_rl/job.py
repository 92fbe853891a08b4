"""Wiring of the online RL job: environment, Serve apps, buffer, rollout workers, trainer.

``run(cfg)`` starts (or connects to) each part, trains until ``trainer.max_steps``, then shuts
everything down in reverse order — also on Ctrl-C / ``ray job stop`` — releasing every
environment session. See ``workflows/online_rl/cli.py`` for the command line.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from train_loops.jsonl import JsonlWriter, read_jsonl
from workflows.common.config_io import dump_config
from workflows.common.signals import sigterm_as_interrupt
from workflows.common.tracking import Tracker
from workflows.online_rl.batches import RolloutBatcher
from workflows.online_rl.config import OnlineRLConfig
from workflows.online_rl.metrics import (
    DashboardMetrics,
    learning_curve_png,
    progress_line,
    tree_memory_gb,
)


@contextlib.contextmanager
def environment_service(cfg: OnlineRLConfig) -> Iterator[str]:
    """The configured env service URL, or an embedded server started for this job."""
    if cfg.env.server_url:
        yield cfg.env.server_url
        return
    from env_client.server import start_embedded_server

    with start_embedded_server(cfg.env.embedded, log_path=cfg.run_dir / "env_server.log") as server:
        print(f"[job] embedded environment server at {server.url}", flush=True)
        yield server.url


class JobState:
    """Task cursor and counters per published version, so a resume restarts where it left."""

    def __init__(self, run_dir: Path) -> None:
        self.dir = run_dir / "job_state"
        self.dir.mkdir(parents=True, exist_ok=True)

    def save(self, version: int, state: dict[str, Any]) -> None:
        tmp = self.dir / f"v{version:06d}.json.tmp"
        tmp.write_text(json.dumps(state))
        tmp.replace(self.dir / f"v{version:06d}.json")

    def load(self, version: int) -> dict[str, Any]:
        path = self.dir / f"v{version:06d}.json"
        return json.loads(path.read_text()) if path.exists() else {}


class Publisher:
    """The trainer's ``publish_fn``: weights to every policy replica, then the new version to
    the buffer (which gates staleness) and the job state beside it. Picklable."""

    def __init__(self, run_dir: str, weights: Any, buffer_name: str) -> None:
        self.run_dir = run_dir
        self.weights = weights  # the policy's serve_apps WeightSyncConfig
        self.buffer_name = buffer_name

    def __call__(self, state_dict: dict[str, Any], version: int) -> None:
        import ray

        from serve_apps.weights.publisher import publish_weights

        publish_weights(state_dict, version, self.weights.registry_name, self.weights.namespace)
        buffer = ray.get_actor(self.buffer_name)
        ray.get(buffer.set_version.remote(version))
        stats = ray.get(buffer.stats.remote())
        JobState(Path(self.run_dir)).save(version, {"cursor": stats["cursor"], "stats": stats})


class Committer:
    """The trainer's ``commit_fn``: the samples a stored checkpoint holds are trained, so the
    buffer moves their groups to ``trained/``. Picklable."""

    def __init__(self, buffer_name: str) -> None:
        self.buffer_name = buffer_name

    def __call__(self, step: int, sample_ids: list[str]) -> None:
        import ray

        # Waited for, so commits arrive in order; a lost one is repaired by the next requeue.
        with contextlib.suppress(Exception):
            ray.get(ray.get_actor(self.buffer_name).commit.remote(step, sample_ids), timeout=60)


def policy_registry(cfg: OnlineRLConfig) -> str:
    """A registry per run: two jobs (or a job and a test) on one cluster never cross weights."""
    return f"{cfg.run_name}-policy"


def published_version(cfg: OnlineRLConfig) -> int:
    """The highest weight version this run ever published: its registry's latest, or the job
    state's newest record when the registry is gone (a killed job's detached registry may live
    on; a restarted one forgets)."""
    import ray

    from serve_apps.weights.registry import registry_actor_name

    versions = [int(p.stem[1:]) for p in (cfg.run_dir / "job_state").glob("v*.json")]
    with contextlib.suppress(Exception):
        name = registry_actor_name(policy_registry(cfg))
        registry = ray.get_actor(name, namespace=cfg.policy.weights.namespace)
        latest: Any = ray.get(registry.latest_version.remote(), timeout=30)
        versions.append(int(latest or 0))
    return max(versions, default=0)


class Monitor(threading.Thread):
    """Polls the buffer, rollout workers and trainer metrics; writes JSONL, dashboard gauges and
    the console progress line."""

    def __init__(self, cfg: OnlineRLConfig, buffer: Any, fleet: Any) -> None:
        super().__init__(daemon=True)
        self.cfg, self.buffer, self.fleet = cfg, buffer, fleet
        self.jsonl = JsonlWriter(cfg.run_dir / "metrics.jsonl")
        self.tracker = Tracker(cfg.tracking, cfg.run_dir, cfg.run_name, cfg.model_dump(mode="json"))
        self.dashboard = DashboardMetrics(cfg.run_name)
        self.t0 = time.time()
        self.stop_event = threading.Event()
        self._last: dict[str, float] = {}
        self._success_window: list[tuple[float, float]] = []
        self.peak_mem_gb = 0.0
        self.extra: dict[str, float] = {"entropulse/phase": 0.0}  # set by the training thread

    def run(self) -> None:
        while not self.stop_event.wait(self.cfg.progress_every_s):
            for line in self.fleet.check():
                print(f"[job] {line}", flush=True)
            self.report()

    def report(self) -> dict[str, Any]:
        import ray

        rec = self.collect(ray.get(self.buffer.stats.remote()), self.fleet.stats())
        self.jsonl.write(rec)
        self.tracker.log(rec)
        self.dashboard.update(rec)
        print(progress_line(rec), flush=True)
        return rec

    def collect(self, buf: dict[str, float], workers: list[dict[str, float]]) -> dict[str, Any]:
        now = time.time()
        total = {k: sum(w.get(k, 0.0) for w in workers) for k in workers[0]} if workers else {}
        steps = total.get("env_steps", 0.0)
        dt = now - self._last.get("t", self.t0)
        rec: dict[str, Any] = {
            "time/elapsed_s": now - self.t0,
            "env/steps": steps,
            "env/steps_per_s": (steps - self._last.get("steps", 0.0)) / max(dt, 1e-6),
            "rollout/episodes": buf["episodes"],
            "rollout/groups_started": buf["groups_started"],
            "rollout/groups_completed": buf["groups_completed"],
            "rollout/groups_cancelled": buf["groups_cancelled"],
            "rollout/groups_restored": buf["groups_restored"],
            "rollout/groups_dropped_failed": buf["groups_dropped_failed"],
            "rollout/groups_dropped_stale": buf["groups_dropped_stale"],
            "rollout/groups_worker_died": buf["groups_worker_died"],
            "rollout/groups_abandoned": buf["groups_abandoned"],
            "rollout/groups_trained": buf["groups_trained"],
            "rollout/worker_restarts": float(self.fleet.restarts),
            "rollout/policy_retries": total.get("policy_retries", 0.0),
            "buffer/samples_requeued": buf["samples_requeued"],
            "buffer/samples_trained": buf["samples_trained"],
            "rollout/groups_in_flight": buf["groups_in_flight"],
            "rollout/mean_version_lag": buf["mean_lag"],
            "rollout/invalid_actions": total.get("invalid_actions", 0.0),
            "rollout/episode_retries": total.get("episode_retries", 0.0),
            "rollout/tasks_skipped": buf["tasks_skipped"],
            "rollout/tasks_saturated": buf["tasks_saturated"],
            "rollout/analyzer_errors": total.get("analyzer_errors", 0.0),
            "rollout/score_errors": total.get("score_errors", 0.0),
            "buffer/samples": buf["buffered_samples"],
            "buffer/samples_out": buf["samples_out"],
            "buffer/samples_dropped_zero_grad": buf["samples_dropped_zero_grad"],
            "rollout/groups_zero_grad": buf["groups_zero_grad"],
            "serve/policy_version": min((w["served_version"] for w in workers), default=0),
            "train/version": buf["version"],
        }
        for key in ("generate", "env", "analyze", "score"):
            rec[f"latency/{key}_s"] = total.get(f"t_{key}", 0.0) / max(steps, 1.0)
        if "rollout_batches" in buf:  # trainer.schedule=rollout_batch
            rec["buffer/rollout_batches"] = buf["rollout_batches"]
            rec["buffer/rollout_batches_empty"] = buf["rollout_batches_empty"]
        if buf["episodes"]:  # no success rate before the first episode ends (not 0.00)
            rec["rollout/success_rate"] = buf["success_rate"]
        # Per task family (MiniWoB kind, OSWorld domain).
        rec.update({f"rollout/{k}": v for k, v in buf.items() if k.startswith("success_rate/")})
        rec["mem/job_pss_gb"] = tree_memory_gb()
        self.peak_mem_gb = max(self.peak_mem_gb, rec["mem/job_pss_gb"])
        rec["mem/peak_job_pss_gb"] = self.peak_mem_gb
        self._window(rec, buf)
        rec.update(self._train_metrics())
        rec.update(self.extra)
        self._last = {"t": now, "steps": steps}
        return rec

    def _window(self, rec: dict[str, Any], buf: dict[str, float]) -> None:
        self._success_window.append((buf["episodes"], buf["episodes_success"]))
        self._success_window = self._success_window[-6:]
        (e0, s0), (e1, s1) = self._success_window[0], self._success_window[-1]
        if e1 > e0:
            rec["rollout/window_success_rate"] = (s1 - s0) / (e1 - e0)

    def _train_metrics(self) -> dict[str, Any]:
        rows = read_jsonl(self.cfg.run_dir / "train_metrics.jsonl")
        if not rows:
            return {}
        # Every RL optimizer step at its own step (the progress records sample the last one).
        self.tracker.log_steps("rl_step", [r for r in rows if "loss/pg" in r], "train/step")
        last = rows[-1]
        out = {k: v for k, v in last.items() if isinstance(v, (int, float))}
        busy = sum(r.get("step_time", 0.0) for r in rows)
        out["train/idle_frac"] = max(0.0, 1.0 - busy / max(time.time() - self.t0, 1e-6))
        return out


def run(cfg: OnlineRLConfig) -> dict[str, Any]:
    """Run the job to completion; returns the last metrics record."""
    import ray

    from workflows.common.ray_cluster import init_ray, shutdown_ray
    from workflows.online_rl.rl_phases import set_aside

    run_dir = cfg.run_dir
    earlier = None if cfg.resume else set_aside(run_dir)
    if earlier is not None:
        print(f"[job] resume=false: the earlier run folder is kept as {earlier}", flush=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, run_dir / "config.yaml")
    started_ray = not ray.is_initialized()
    init_ray(cfg.ray)
    print(f"[job] run folder: {run_dir}", flush=True)
    try:
        with sigterm_as_interrupt(), environment_service(cfg) as env_url:
            return _run_with_env(cfg, env_url)
    finally:
        if started_ray:
            shutdown_ray()


def _resolved_models(cfg: OnlineRLConfig, resume_dir: Path | None, version: int) -> OnlineRLConfig:
    """model_path 'tiny:<seed>' → a built tiny checkpoint; the policy replicas serve the resume
    checkpoint's weights at its version (the trainer keeps the base model as its model_path)."""
    policy_path = resume_dir or Path(_model_path(cfg.policy.model_path, "policy"))
    weights = cfg.policy.weights.model_copy(
        update={"initial_version": version, "registry_name": policy_registry(cfg)}
    )
    policy = cfg.policy.model_copy(update={"model_path": str(policy_path), "weights": weights})
    analyzer = cfg.analyzer.model_copy(
        update={"model_path": _model_path(cfg.analyzer.model_path, "analyzer")}
    )
    return cfg.model_copy(update={"policy": policy, "analyzer": analyzer})


def _start_version(cfg: OnlineRLConfig, checkpoint_version: int) -> int:
    """The version the job serves first. A job killed after publishing past its last
    checkpoint resumes at the next free version (the checkpoint's weights, newly numbered),
    so the served version never goes backwards; a registry left over from the killed job
    (detached) is removed first, or its newer, lost weights would be served."""
    from serve_apps.weights.registry import kill_registry

    published = published_version(cfg)
    kill_registry(policy_registry(cfg), cfg.policy.weights.namespace)
    if published <= checkpoint_version:
        return checkpoint_version
    print(
        f"[job] versions up to {published} were published after the checkpoint (version "
        f"{checkpoint_version}): its weights are served as version {published + 1}",
        flush=True,
    )
    return published + 1


def _model_path(path: str, name: str) -> str:
    """A folder, ``tiny:<seed>`` (random tiny checkpoint) or ``warm:<seed>`` (the cached warm
    start's policy/analyzer, built on first use) → a local checkpoint folder."""
    from workflows.warm_start.config import is_warm

    if is_warm(path):
        from workflows.warm_start.build import warm_member

        return str(warm_member(path, name))
    from workflows.common.pipeline import resolve_model_path

    return resolve_model_path(path, name)


def _start_serving(cfg: OnlineRLConfig) -> None:
    from ray import serve

    from serve_apps.analyzer import build_analyzer_app
    from serve_apps.policy import build_policy_app

    t0 = time.time()
    # Per-request access logs would drown the progress line; they stay in Ray's log files.
    quiet = {"log_level": "WARNING", "enable_access_log": False}
    serve.start(
        http_options={"host": "127.0.0.1", "port": cfg.serve_http_port}, logging_config=quiet
    )
    serve.run(
        build_policy_app(cfg.policy),
        name=cfg.policy.name,
        route_prefix=cfg.policy.route_prefix,
        logging_config=quiet,
    )
    if cfg.rollout.use_analyzer:
        serve.run(
            build_analyzer_app(cfg.analyzer),
            name=cfg.analyzer.name,
            route_prefix=cfg.analyzer.route_prefix,
            logging_config=quiet,
        )
    print(
        f"[job] Serve apps up in {time.time() - t0:.0f}s "
        f"(policy OpenAI endpoint: http://127.0.0.1:{cfg.serve_http_port}{cfg.policy.route_prefix}/v1)",
        flush=True,
    )


def _run_with_env(cfg: OnlineRLConfig, env_url: str) -> dict[str, Any]:
    import ray

    from env_client.tasks.sources import make_task_source
    from train_loops.lineage import lineage_ids, read_lineage
    from workflows.common.pipeline import preflight_task, round_robin, select_tasks
    from workflows.online_rl.buffer import TrajectoryBuffer
    from workflows.online_rl.curriculum import TaskPicker
    from workflows.online_rl.fleet import RolloutFleet
    from workflows.online_rl.rl_phases import ResumePoint, resume_point
    from workflows.online_rl.rollout import RolloutWorker

    t_start = time.time()
    run_dir = cfg.run_dir
    point = resume_point(run_dir) if cfg.resume else ResumePoint()
    if point.checkpoint:
        print(
            f"[job] resuming from {point.checkpoint} (RL step {point.step}, version "
            f"{point.version}, {point.phases_done} Entropulse phases done)",
            flush=True,
        )
    if point.step >= cfg.trainer.max_steps:
        print(f"[job] already at step {point.step} >= trainer.max_steps={cfg.trainer.max_steps}")
    source = make_task_source(cfg.task_source)
    split = select_tasks(source.tasks(cfg.rollout.train_split), cfg.rollout.tasks, None)
    tasks = round_robin(split, cfg.seed)
    if cfg.rollout.fixed_guidance_file:  # a malformed file fails here, not in every worker
        from workflows.online_rl.fixed_guidance import load_guidance

        table = load_guidance(cfg.rollout.fixed_guidance_file)
        print(f"[job] fixed guidance for {len(table)} tasks (the analyzer is not asked)")
    if cfg.rollout.preflight:
        preflight_task(cfg.env, env_url, source.instance(tasks[0], 0), cfg.task_source.kind)
    base_policy = _model_path(cfg.policy.model_path, "policy")
    start_version = _start_version(cfg, point.version)
    cfg = _resolved_models(cfg, point.checkpoint, start_version)
    _start_serving(cfg)
    buffer = (
        ray.remote(TrajectoryBuffer)
        .options(name=f"{cfg.run_name}-buffer", num_cpus=0, max_concurrency=1000)
        .remote(
            cfg.buffer,
            cfg.trainer.samples_per_step,
            cfg.mode,
            str(run_dir / "trajectories"),
            start_version,
            JobState(run_dir).load(point.version).get("cursor", 0),
            cfg.loss.sd_type,
            {str(t["task"]): str(t.get("kind") or "other") for t in tasks},
            cfg.rollout.max_groups,
            TaskPicker(
                [str(t["task"]) for t in tasks],
                cfg.rollout.task_order,
                cfg.rollout.saturation_window,
                cfg.rollout.explore,
                seed=cfg.seed,
            ),
            sorted(lineage_ids(read_lineage(point.checkpoint))),
            _batcher(cfg),
        )
    )
    worker_cls = ray.remote(RolloutWorker).options(
        num_cpus=cfg.rollout.worker_num_cpus, max_concurrency=64
    )
    analyzer_app = cfg.analyzer.name if cfg.rollout.use_analyzer else None
    fleet = RolloutFleet(
        lambda i: worker_cls.remote(cfg, i, tasks, env_url, buffer, cfg.policy.name, analyzer_app),
        cfg.rollout.num_workers,
        buffer,
    )
    monitor = Monitor(cfg, buffer, fleet)
    monitor.start()
    publisher = Publisher(str(run_dir), cfg.policy.weights, f"{cfg.run_name}-buffer")
    try:
        steps = _train(cfg, base_policy, buffer, publisher, point, monitor, start_version)
    finally:
        # Stopped (Ctrl-C, `ray job stop`: SIGKILL follows after a grace time) or failed: the
        # in-flight episodes get a short time to finish; a finished job waits for them.
        last = _stop(buffer, fleet, monitor, 15.0 if sys.exc_info()[0] else 120.0)
        monitor.tracker.close()
        if not cfg.keep_serving:
            _delete_apps(cfg)
    png = learning_curve_png(
        read_jsonl(run_dir / "metrics.jsonl"), run_dir / "learning_curve.png", cfg.run_name
    )
    phases = (
        f", {monitor.extra['entropulse/phases']:.0f} Entropulse phases"
        if cfg.entropulse.enabled
        else ""
    )
    print(
        f"[job] {steps} RL optimizer steps{phases}, served version "
        f"{last['serve/policy_version']:.0f}, {last['rollout/episodes']:.0f} episodes, peak memory "
        f"{last['mem/peak_job_pss_gb']:.1f} GiB (PSS of the job's process tree), "
        f"{time.time() - t_start:.0f}s",
        flush=True,
    )
    print(
        f"[job] done. outputs in {run_dir}: metrics.jsonl, train_metrics.jsonl, {png.name}, "
        f"checkpoints under {run_dir}/rl*",
        flush=True,
    )
    return last


def _train(
    cfg: OnlineRLConfig,
    base_policy: str,
    buffer: Any,
    publisher: Publisher,
    point: Any,  # workflows.online_rl.rl_phases.ResumePoint
    monitor: Monitor,
    start_version: int,
) -> int:
    """RL segments until ``trainer.max_steps`` RL steps, an Entropulse SFT phase between two
    segments whenever the loop's ``EntropulseStop`` ends one (see ``workflows.online_rl.rl_phases``).
    A fit whose worker group dies is started again from the newest checkpoint, up to
    ``trainer.max_failures`` times (:func:`_after_trainer_failure`). Returns the RL steps done."""
    import ray

    from train_loops.config import RLTrainConfig
    from train_loops.trainers import build_rl_trainer
    from workflows.online_rl.entropulse import Entropulse, EntropulseStop, Trigger
    from workflows.online_rl.rl_phases import ResumePoint, end_reason

    pulse = Entropulse(cfg.entropulse, cfg.run_dir, cfg.trainer, cfg.optim, metrics=monitor.jsonl)
    monitor.extra["entropulse/phases"] = float(pulse.phases)
    # Restarts are the job's, not Ray Train's: between two attempts the buffer must take back
    # the rows the dead one held (see _after_trainer_failure).
    trainer_cfg = cfg.trainer.model_copy(update={"max_failures": 0})
    rl_cfg = RLTrainConfig(trainer=trainer_cfg, optim=cfg.optim, loss=cfg.loss)
    committer = Committer(f"{cfg.run_name}-buffer")
    failures = 0
    while True:
        epoch = ray.get(buffer.open_stream.remote())
        streams = _streams(cfg, buffer, epoch)
        stop_fn = EntropulseStop(cfg.entropulse, pulse.phases) if cfg.entropulse.enabled else None
        trainer = build_rl_trainer(
            rl_cfg, base_policy, streams, publisher, cfg.run_dir,
            resume_from=point.checkpoint, run_name=point.run_name, start_step=point.step,
            stop_fn=stop_fn, commit_fn=committer, start_version=start_version,
        )  # fmt: skip
        try:
            result = trainer.fit()
        except Exception as exc:  # the worker group died (a killed process, a lost node)
            ray.get(buffer.end_stream.remote())
            failures += 1
            if failures > cfg.trainer.max_failures:
                raise
            point, start_version = _after_trainer_failure(cfg, buffer, exc, failures)
            continue
        ray.get(buffer.end_stream.remote())  # the ended fit's read tasks stop taking rows
        checkpoint = Path(result.checkpoint.path) if result.checkpoint else point.checkpoint
        step = point.step if checkpoint is None else _checkpoint_step(checkpoint, point.step)
        if end_reason(cfg.run_dir, point.run_name) != "stop_requested" or checkpoint is None:
            return step
        trigger = pulse.poll() or Trigger(cfg.entropulse.trigger, None, step - point.step)
        print(
            f"[job] Entropulse trigger ({trigger.reason}, entropy {trigger.entropy}) after RL "
            f"step {step}: SFT phase {pulse.phases + 1}",
            flush=True,
        )
        monitor.extra["entropulse/phase"] = 1.0
        phase = pulse.run_phase(checkpoint, trigger, publish_fn=publisher)
        monitor.extra.update({"entropulse/phase": 0.0, "entropulse/phases": float(pulse.phases)})
        outcome = f"skipped ({phase.reason})" if phase.skipped else f"{phase.sft_steps} SFT steps"
        print(
            f"[job] Entropulse phase {phase.phase}: {outcome} on {phase.num_samples} successful "
            f"samples in {phase.elapsed_s:.0f}s; RL continues at version {phase.version}",
            flush=True,
        )
        point = ResumePoint(pulse.phases, Path(phase.checkpoint), step, phase.version)


def _batcher(cfg: OnlineRLConfig) -> RolloutBatcher | None:
    """The buffer's rollout batches under the authors' schedule (one update per batch)."""
    if cfg.trainer.schedule != "rollout_batch":
        return None
    t = cfg.trainer
    return RolloutBatcher(cfg.buffer.groups_per_batch, t.num_workers, t.micro_batch_size)


def _streams(cfg: OnlineRLConfig, buffer: Any, epoch: int) -> dict[str, Any]:
    """The trainer's datasets over the buffer: one split stream, or one per rank."""
    from train_loops.loop import rank_dataset
    from workflows.online_rl.stream import buffer_dataset

    kb = cfg.ray.data_block_size_kb
    if cfg.trainer.schedule != "rollout_batch":
        return {
            "train": buffer_dataset(buffer, cfg.trainer.num_workers, epoch=epoch, block_size_kb=kb)
        }
    return {
        rank_dataset(r): buffer_dataset(buffer, epoch=epoch, block_size_kb=kb, rank=r)
        for r in range(cfg.trainer.num_workers)
    }


def _after_trainer_failure(
    cfg: OnlineRLConfig, buffer: Any, exc: BaseException, failures: int
) -> tuple[Any, int]:
    """After a dead fit (its stream epoch already ended): the newest checkpoint is where the
    next attempt starts; rows the dead attempt was handed and that checkpoint's lineage lacks
    go back to the buffer's queue; the next attempt publishes its weights as the next free
    version (the dead one may have published past its checkpoint)."""
    import ray

    from train_loops.lineage import lineage_ids, read_lineage
    from workflows.online_rl.rl_phases import resume_point

    point = resume_point(cfg.run_dir)
    trained = sorted(lineage_ids(read_lineage(point.checkpoint)))
    requeued = ray.get(buffer.requeue.remote(trained))
    published = published_version(cfg)
    start_version = point.version if published <= point.version else published + 1
    print(
        f"[job] trainer failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
        f"attempt {failures + 1} of {cfg.trainer.max_failures + 1} resumes from "
        f"{point.checkpoint or 'the base model'} (RL step {point.step}), {requeued} samples "
        f"handed to the dead attempt are queued again, weights served as version {start_version}",
        flush=True,
    )
    return point, start_version


def _checkpoint_step(checkpoint: Path, default: int) -> int:
    state = checkpoint / "trainer_state.json"
    return int(json.loads(state.read_text()).get("step", default)) if state.exists() else default


def _delete_apps(cfg: OnlineRLConfig) -> None:
    """On a shared cluster the job's replicas must not outlive it (their CPUs/GPUs stay taken)."""
    from ray import serve

    from serve_apps.weights.registry import kill_registry

    for name in (cfg.policy.name, cfg.analyzer.name):
        with contextlib.suppress(Exception):
            serve.delete(name)
    with contextlib.suppress(Exception):  # detached: it would outlive the job
        kill_registry(cfg.policy.weights.registry_name, cfg.policy.weights.namespace)


def _stop(buffer: Any, fleet: Any, monitor: Monitor, timeout_s: float) -> dict[str, Any]:
    """Close the buffer (rollouts stop starting groups), let in-flight episodes release their
    sessions (cancelled after ``timeout_s``; their release still runs), then take the final
    metrics record."""
    import ray

    ray.get(buffer.close.remote())
    fleet.stop(timeout_s)
    monitor.stop_event.set()
    return monitor.report()
