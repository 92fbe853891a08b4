"""Fault-injection soak of the whole online job, audited from its own outputs.

    python benchmarks/soak.py                      # 15 minutes, seed 0
    python benchmarks/soak.py --minutes 3 --short  # every process-level fault kind once

What runs: a Ray cluster of its own (``ray start --head``, dashboard on, as a user's), the
embedded environment server as a process of its own with seeded fault rules (HTTP 503s,
answers held past the client's timeout, sessions lost mid-episode, browsers killed, release
answers lost: ``--env-fault-rate`` of the operations), and the embedded job submitted with
``ray job submit`` semantics (tiny models: the soak is about the plumbing, not learning).

What hits it, on a schedule fixed by ``--seed``: a rollout worker process killed, the policy
replica killed, the analyzer replica killed, one trainer worker killed (the job restarts the
fit from the newest checkpoint), the environment server killed (SIGKILL) and started again on
the same port, the driver stopped with ``ray job stop`` and the job submitted again under the
same ``run_name`` (it resumes). Hostile pyautogui commands go to the environment server after
each of its starts.

What is checked afterwards (``workflows.online_rl.accounting`` on the run folder, the
environment server, the process table): every started group trained, pending or dropped with a
recorded reason, none twice, none lost; every trained sample in exactly one optimizer step of
the final weights' lineage, ``samples_per_step`` per step; no environment session open and no
browser left behind; the served weight version (polled over HTTP) never goes backwards; no
hostile command executed; peak memory within ``--memory-budget-gb``. The last line is exactly

    soak: faults=<n> lost_groups=<n> duplicate_groups=<n> leaked_sessions=<n> crashed=<yes|no>

and the exit status is 0 only when all checks pass. ``soak_report.json`` in the run folder
holds the details (fault log, outcomes, versions seen).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # before benchmarks/env_client.py can shadow the package

KINDS = (
    "rollout_worker",
    "policy_replica",
    "analyzer_replica",
    "trainer_worker",
    "env_server",
    "job_resubmit",
)


@dataclass
class SoakConfig:
    minutes: float = 15.0
    seed: int = 0
    out: Path = Path(tempfile.gettempdir()) / "computersd-soak"
    short: bool = False  # every process-level fault kind once (the test suite's version)
    env_fault_rate: float = 0.05  # share of environment operations that get a fault
    every_s: float = 60.0  # one process-level fault per this many seconds (long version)
    memory_budget_gb: float = 8.0
    ready_timeout_s: float = 600.0
    log: Callable[[str], None] = print


@dataclass
class SoakReport:
    faults: int = 0
    fault_kinds: list[str] = field(default_factory=list)
    env_faults: int = 0
    fault_log: list[dict[str, Any]] = field(default_factory=list)
    lost_groups: int = 0
    duplicate_groups: int = 0
    leaked_sessions: int = 0
    crashed: bool = False
    problems: list[str] = field(default_factory=list)
    outcomes: dict[str, int] = field(default_factory=dict)
    groups_started: int = 0
    optimizer_steps: int = 0
    trained_samples: int = 0
    versions_seen: list[int] = field(default_factory=list)
    peak_memory_gb: float = 0.0
    hostile_sent: int = 0
    hostile_refused: int = 0
    elapsed_s: float = 0.0

    @property
    def passed(self) -> bool:
        return (
            not (self.lost_groups or self.duplicate_groups or self.leaked_sessions or self.crashed)
            and not self.problems
        )

    def last_line(self) -> str:
        return (
            f"soak: faults={self.faults} lost_groups={self.lost_groups} "
            f"duplicate_groups={self.duplicate_groups} leaked_sessions={self.leaked_sessions} "
            f"crashed={'yes' if self.crashed else 'no'}"
        )


# ---- small helpers ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_json(method: str, url: str, body: Any = None, timeout: float = 10.0) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        with contextlib.suppress(Exception):
            return exc.code, json.loads(exc.read() or b"null")
        return exc.code, None


class Abort(RuntimeError):
    """Raised by a wait's check: stop waiting, it will never come true."""


def wait_for(check: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 1.0) -> None:
    """Poll ``check`` until True; its errors count as 'not yet', except :class:`Abort`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Abort:
            raise
        except Exception:  # a part still starting (connection refused, 503)
            pass
        time.sleep(poll_s)
    raise TimeoutError(f"{what}: not within {timeout_s:.0f}s")


def processes_with_env(marker: str) -> list[int]:
    """Pids whose environment carries ``marker`` (the soak's processes and their children,
    reparented or not)."""
    found = []
    needle = marker.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle in (entry / "environ").read_bytes():
                found.append(int(entry.name))
    return found


def browser_pids(marker: str) -> list[int]:
    out = []
    for pid in processes_with_env(marker):
        with contextlib.suppress(OSError):
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            if "chrom" in cmd.lower():
                out.append(pid)
    return out


# ---- the parts ----------------------------------------------------------------------------


class EnvServer:
    """The environment server as a process of its own, restartable on the same port."""

    def __init__(self, cfg: SoakConfig, folder: Path, marker: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.folder = folder
        self.marker = marker
        self.proc: subprocess.Popen[bytes] | None = None
        self.lives = 0
        self.fired_before = 0  # faults fired by earlier lives
        rate = cfg.env_fault_rate
        rule = {"times": 10**9}
        # Each kind's share of the rate; seeds differ per kind and per soak seed.
        self.rules = [
            {**rule, "op": "any", "kind": "http_503", "rate": rate * 0.4, "seed": cfg.seed},
            {**rule, "op": "step", "kind": "delay", "delay_s": 14.0, "rate": rate * 0.15,
             "seed": cfg.seed + 1},
            {**rule, "op": "step", "kind": "lose_session", "rate": rate * 0.15,
             "seed": cfg.seed + 2},
            {**rule, "op": "reset", "kind": "kill_browser", "rate": rate * 0.15,
             "seed": cfg.seed + 3},
            {**rule, "op": "release", "kind": "http_503", "phase": "after", "rate": rate * 0.15,
             "seed": cfg.seed + 4},
        ]  # fmt: skip

    def start(self) -> None:
        config = {"capacity": 8, "prewarm": 2, "heartbeat_timeout_s": 20.0, "faults": self.rules}
        env = {**os.environ, "COMPUTERSD_SOAK": self.marker}
        log = (self.folder / "env_server.log").open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "env_client.server", "--port", str(self.port), "--fault-api",
             "--config-json", json.dumps(config)],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        wait_for(lambda: http_json("GET", f"{self.url}/healthz")[0] == 200, 120, "env server")
        self.lives += 1

    def fired(self) -> int:
        status, data = http_json("GET", f"{self.url}/v1/faults")
        if status != 200:
            return self.fired_before
        return self.fired_before + sum(int(r["fired"]) for r in data.get("rules", []))

    def crash(self) -> int:
        """SIGKILL the server process alone (its browsers are not told); returns its pid."""
        assert self.proc is not None
        self.fired_before = self.fired()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        return self.proc.pid

    def open_sessions(self) -> int:
        status, data = http_json("GET", f"{self.url}/v1/sessions")
        return int(data["count"]) if status == 200 else -1

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


class RayCluster:
    """``ray start --head`` with its dashboard (job submission), stopped at the end."""

    def __init__(self, folder: Path, marker: str) -> None:
        self.port, self.dashboard_port = free_port(), free_port()
        self.dashboard = f"http://127.0.0.1:{self.dashboard_port}"
        self.folder = folder
        # Ray >= 2.59 turns token auth on for a cluster when ~/.ray/auth_token exists (any
        # earlier local ray.init writes one): say so explicitly, for the cluster and for this
        # process's job and state clients alike, which then send the token.
        os.environ.setdefault("RAY_AUTH_MODE", "token")
        # ray job stop waits this long after SIGTERM before it kills: the job's clean stop.
        self.env = {**os.environ, "RAY_JOB_STOP_WAIT_TIME_S": "60", "COMPUTERSD_SOAK": marker}
        self.ray = str(Path(sys.executable).with_name("ray"))
        self.marker = marker
        # Short: Ray's socket paths under it must stay within the 107-byte limit.
        self.temp_dir = Path(tempfile.gettempdir()) / f"ray-{marker}"

    def start(self) -> None:
        # A temp dir of its own: this cluster's files and sockets never mix with another Ray on
        # the machine (a test session's, a user's).
        # The dashboard agent's port too: its default (52365) is taken by any other Ray on the
        # machine, and without an agent no job can be submitted.
        cmd = [self.ray, "start", "--head", f"--port={self.port}", "--num-cpus=6",
               "--include-dashboard=true", f"--dashboard-port={self.dashboard_port}",
               f"--dashboard-agent-listen-port={free_port()}",
               f"--temp-dir={self.temp_dir}", "--disable-usage-stats"]  # fmt: skip
        # Token mode needs a token before `ray start`: on a fresh machine (no earlier local
        # ray.init) there is none, and `ray start` refuses. `--generate` writes one only then.
        self._run_logged(
            [self.ray, "get-auth-token", "--generate"], "ray get-auth-token", secret_stdout=True
        )
        self._run_logged(cmd, "ray start")
        from ray.job_submission import JobSubmissionClient

        wait_for(lambda: bool(JobSubmissionClient(self.dashboard)), 300, "Ray dashboard", 2.0)
        self.jobs = JobSubmissionClient(self.dashboard)

    def _run_logged(self, cmd: list[str], what: str, secret_stdout: bool = False) -> None:
        """Run a Ray CLI command into ray_start.log; on failure, raise with the log's tail, so
        the soak's report says why (the command line alone does not). A secret stdout (the
        token) is dropped, never logged."""
        log_path = self.folder / "ray_start.log"
        with log_path.open("ab") as log:
            log.write(f"$ {' '.join(cmd)}\n".encode())
            log.flush()
            out = subprocess.DEVNULL if secret_stdout else log
            rc = subprocess.run(cmd, env=self.env, stdout=out, stderr=log).returncode
        if rc != 0:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-8:]
            raise RuntimeError(f"{what} exited {rc}; {log_path} ends:\n" + "\n".join(tail))

    def actors(self, class_prefix: str) -> list[dict[str, Any]]:
        from ray.util.state import list_actors

        alive = list_actors(
            address=self.dashboard, filters=[("state", "=", "ALIVE")], limit=1000,
            raise_on_missing_output=False,
        )  # fmt: skip
        return [
            {"pid": a.pid, "name": a.class_name}
            for a in alive
            if str(a.class_name).startswith(class_prefix)
        ]

    def stop(self) -> None:
        """Stop this cluster's processes only: `ray stop` would stop every Ray cluster on the
        machine, and a driver whose raylet dies exits at once (a pytest session with its own
        cluster, for one). Every process of this cluster carries the soak's marker."""
        for sig, wait_s in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 10.0)):
            pids = [p for p in processes_with_env(self.marker) if not _is_browser(p)]
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)
            with contextlib.suppress(TimeoutError):
                wait_for(lambda p=pids: not _alive_any(p), wait_s, "Ray processes gone", 0.5)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _alive_any(pids: list[int]) -> bool:
    return any(Path(f"/proc/{pid}").exists() and _state(pid) != "Z" for pid in pids)


def _state(pid: int) -> str:
    with contextlib.suppress(OSError, IndexError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return "?"


def _is_browser(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return b"chrom" in Path(f"/proc/{pid}/cmdline").read_bytes().lower()
    return False


class Job:
    """The online job under ``ray job submit``, resubmittable under the same run_name."""

    def __init__(self, cluster: RayCluster, overrides: list[str], folder: Path) -> None:
        self.cluster = cluster
        self.overrides = overrides
        self.folder = folder
        self.ids: list[str] = []

    def submit(self) -> str:
        args = " ".join(f"'{o}'" for o in self.overrides)
        entry = (
            f"cd {ROOT} && exec {sys.executable} -m workflows.online_rl --config embedded {args}"
        )
        env = {k: os.environ[k] for k in ("DS_ACCELERATOR", "HF_HUB_OFFLINE") if k in os.environ}
        runtime_env = {"env_vars": {**env, "DS_ACCELERATOR": "cpu", "PYTHONUNBUFFERED": "1"}}
        # A dashboard that answers may still lack its job agent ("No available agent to submit
        # job, please try again later"): a fresh cluster takes a while on a busy machine.
        deadline = time.monotonic() + 300
        while True:
            try:
                sid = self.cluster.jobs.submit_job(entrypoint=entry, runtime_env=runtime_env)
                break
            except RuntimeError as exc:
                if "try again" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(3.0)
        self.ids.append(sid)
        return sid

    def status(self) -> str:
        return str(self.cluster.jobs.get_job_status(self.ids[-1]))

    def stop(self, timeout_s: float = 240.0) -> str:
        """``ray job stop``: SIGTERM (the job stops cleanly), SIGKILL after the grace time."""
        self.cluster.jobs.stop_job(self.ids[-1])
        wait_for(lambda: self.status() in TERMINAL, timeout_s, "job stop", 2.0)
        return self.status()

    def save_logs(self) -> None:
        for sid in self.ids:
            with contextlib.suppress(Exception):
                text = self.cluster.jobs.get_job_logs(sid)
                (self.folder / f"job_{sid}.log").write_text(text)


TERMINAL = {"JobStatus.STOPPED", "JobStatus.SUCCEEDED", "JobStatus.FAILED", "STOPPED",
            "SUCCEEDED", "FAILED"}  # fmt: skip


# ---- the soak -----------------------------------------------------------------------------


class Soak:
    def __init__(self, cfg: SoakConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.marker = f"soak-{uuid.uuid4().hex[:12]}"
        self.folder = cfg.out / f"soak-{time.strftime('%Y%m%d-%H%M%S')}"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.report = SoakReport()
        self.env = EnvServer(cfg, self.folder, self.marker)
        self.cluster = RayCluster(self.folder, self.marker)
        self.serve_port = free_port()
        self.run_name = "soak"
        overrides = [
            f"run_name={self.run_name}",
            f"runs_dir={self.folder}",
            "resume=true",
            f"env.server_url={self.env.url}",
            "env.heartbeat_interval_s=5",
            "env.timeouts.step_s=8",
            "policy.model_path=tiny:0",
            "policy.agent_style=toolcall",
            "analyzer.model_path=tiny:1",
            "analyzer.sampling.max_new_tokens=32",
            "rollout.max_steps=3",
            "rollout.episode_retries=3",
            "rollout.serve_retry_s=180",
            "trainer.max_steps=100000",
            "trainer.checkpoint_every=2",
            "trainer.max_failures=20",
            f"serve_http_port={self.serve_port}",
            "progress_every_s=5",
            "tracking.tensorboard=false",
        ]
        self.job = Job(self.cluster, overrides, self.folder)
        self.run_dir = self.folder / self.run_name
        self.t0 = time.monotonic()

    # ---- driving ----
    def log(self, text: str) -> None:
        self.cfg.log(f"[soak {time.monotonic() - self.t0:6.0f}s] {text}")

    def run(self) -> SoakReport:
        try:
            self._run()
        except Exception as exc:  # the soak itself broke: say so, keep what was learned
            self.report.crashed = True
            self.report.problems.append(f"soak aborted: {type(exc).__name__}: {exc}")
            self.log(f"aborted: {exc!r}")
        finally:
            self._teardown()
        self._audit()
        self.report.elapsed_s = time.monotonic() - self.t0
        (self.folder / "soak_report.json").write_text(json.dumps(asdict(self.report), indent=2))
        return self.report

    def _run(self) -> None:
        self.log(f"folder {self.folder}")
        self.env.start()
        self._hostile()
        self.cluster.start()
        self.job.submit()
        self._wait_ready()
        schedule = self._schedule()
        self.log(f"schedule: {', '.join(schedule)}, one every {self._gap():.0f}s after recovery")
        end = time.monotonic() + self.cfg.minutes * 60
        for kind in schedule:
            self._poll_until(time.monotonic() + self._gap())
            self._inject(kind)
            self._await_recovery(kind)
        self._poll_until(max(end, time.monotonic() + self._gap()))
        self.log("time is up: stopping the job (ray job stop)")
        status = self.job.stop()
        if status not in ("JobStatus.STOPPED", "STOPPED", "JobStatus.SUCCEEDED", "SUCCEEDED"):
            self.report.crashed = True
            self.report.problems.append(f"the job ended {status}, not stopped by the soak")

    def _gap(self) -> float:
        """Seconds of plain running before each process-level fault."""
        if self.cfg.short:
            return self.cfg.minutes * 60 / (len(KINDS) + 1)
        return self.cfg.every_s

    def _schedule(self) -> list[str]:
        """The process-level faults in order: every kind once (short), or one per ``every_s``
        with the resubmission in the middle; the order is drawn from the seed."""
        others = [k for k in KINDS if k != "job_resubmit"]
        if self.cfg.short:
            kinds = list(others)
            self.rng.shuffle(kinds)
            return [*kinds[: len(kinds) // 2], "job_resubmit", *kinds[len(kinds) // 2 :]]
        slots = max(len(KINDS), int(self.cfg.minutes * 60 // self.cfg.every_s) - 1)
        kinds = [others[i % len(others)] for i in range(slots - 1)]
        self.rng.shuffle(kinds)
        return [*kinds[: len(kinds) // 2], "job_resubmit", *kinds[len(kinds) // 2 :]]

    def _await_recovery(self, kind: str, timeout_s: float = 300.0) -> None:
        """After a fault, the whole loop must work again: a group completes (rollouts) and an
        optimizer step runs (training) after it."""
        groups, steps = self._groups_completed(), self._train_steps()
        t0 = time.monotonic()
        try:
            wait_for(
                lambda: self._groups_completed() > groups and self._train_steps() > steps,
                timeout_s, f"recovery from {kind}", 2.0,
            )  # fmt: skip
        except TimeoutError:
            self.report.problems.append(f"no recovery within {timeout_s:.0f}s of fault {kind}")
            return
        self.report.fault_log[-1]["recovered_s"] = round(time.monotonic() - t0, 1)

    def _groups_completed(self) -> int:
        path = self.run_dir / "trajectories" / "ledger.jsonl"
        if not path.exists():
            return 0
        return sum(1 for line in path.read_text().splitlines() if '"ev": "complete"' in line)

    def _wait_ready(self) -> None:
        """Until the (re)started job trains: a new optimizer step after its start."""
        steps_before = self._train_steps()

        def ready() -> bool:
            status = self.job.status()
            if status in TERMINAL:
                raise Abort(f"job ended {status} before it trained")
            return self._train_steps() > steps_before

        wait_for(ready, self.cfg.ready_timeout_s, "job's first optimizer step", 3.0)
        self.log(f"job trains (optimizer steps so far: {self._train_steps()})")

    def _train_steps(self) -> int:
        path = self.run_dir / "train_metrics.jsonl"
        if not path.exists():
            return 0
        return sum(1 for line in path.read_text().splitlines() if '"loss/pg"' in line)

    def _poll_until(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            self._poll()
            status = self.job.status()
            if status in TERMINAL:
                raise RuntimeError(f"the job ended by itself: {status}")
            time.sleep(min(3.0, max(0.0, deadline - time.monotonic())))

    def _poll(self) -> None:
        url = f"http://127.0.0.1:{self.serve_port}/policy/v1/weights"
        with contextlib.suppress(Exception):
            status, data = http_json("GET", url, timeout=5)
            if status == 200:
                self.report.versions_seen.append(int(data["version"]))

    # ---- faults ----
    def _inject(self, kind: str) -> None:
        entry: dict[str, Any] = {"t": round(time.monotonic() - self.t0, 1), "kind": kind}
        try:
            entry["detail"] = getattr(self, f"_fault_{kind}")()
            entry["ok"] = True
        except Exception as exc:
            entry.update(ok=False, detail=f"{type(exc).__name__}: {exc}")
            self.report.problems.append(f"fault {kind} could not be injected: {exc}")
        self.report.fault_log.append(entry)
        self.log(f"fault {kind}: {entry['detail']}")

    def _kill_actor(self, prefix: str) -> str:
        found = self.cluster.actors(prefix)
        if not found:
            raise RuntimeError(f"no live actor whose class starts with {prefix!r}")
        victim = self.rng.choice(found)
        os.kill(int(victim["pid"]), signal.SIGKILL)
        return f"SIGKILL {victim['name']} pid {victim['pid']}"

    def _fault_rollout_worker(self) -> str:
        return self._kill_actor("RolloutWorker")

    def _fault_policy_replica(self) -> str:
        return self._kill_actor("ServeReplica:policy")

    def _fault_analyzer_replica(self) -> str:
        return self._kill_actor("ServeReplica:analyzer")

    def _fault_trainer_worker(self) -> str:
        return self._kill_actor("RayTrainWorker")

    def _fault_env_server(self) -> str:
        pid = self.env.crash()
        time.sleep(3.0)
        self.env.start()
        self._hostile()
        return f"SIGKILL env server pid {pid}, started again on port {self.env.port}"

    def _fault_job_resubmit(self) -> str:
        old = self.job.ids[-1]
        status = self.job.stop()
        new = self.job.submit()
        self._wait_ready()
        return f"ray job stop {old} ({status}); resubmitted as {new}, resumed and training"

    def _hostile(self) -> None:
        """Commands that try to escape the whitelist, on a live episode: each must be refused
        (4xx), none may run a GUI action or create its marker file. The injected faults can
        stretch the check past the server's heartbeat timeout; the session is kept alive with
        heartbeats, and a check whose session was reclaimed anyway is played again (a
        reclaimed session cannot say how many actions ran)."""
        marker = self.folder / f"hostile-{self.env.lives}"
        for attempt in range(3):
            sid = f"sess-soak-hostile-{self.env.lives}-{attempt}"
            try:
                verdict = self._hostile_round(sid, marker)
            except Exception as exc:
                verdict = f"hostile check failed: {exc}"
            if verdict != "reclaimed":
                break
        if verdict:
            self.report.problems.append(
                "hostile check: session reclaimed 3 times" if verdict == "reclaimed" else verdict
            )
        if marker.exists():
            self.report.problems.append(f"a hostile command executed: {marker} exists")

    def _hostile_round(self, sid: str, marker: Path) -> str:
        """One hostile check on session ``sid``: "" if clean, "reclaimed", or the problem."""
        from benchmarks.http_fuzz.common import TASK
        from benchmarks.http_fuzz.env_server import gui, hostile_commands

        base = f"{self.env.url}/v1/sessions/{sid}"
        try:
            self._env_call("POST", f"{self.env.url}/v1/sessions", {"session_id": sid})
            self._env_call("POST", f"{base}/reset", {"task_payload": TASK})
            for command in hostile_commands(str(marker)):
                self._env_call("POST", f"{base}/heartbeat", {})
                status, _ = self._env_call("POST", f"{base}/step", {"action": gui(command)})
                self.report.hostile_sent += 1
                self.report.hostile_refused += int(400 <= status < 500)
            self._env_call("POST", f"{base}/heartbeat", {})
            status, truth = self._env_call("GET", f"{base}/debug")
        finally:
            self._env_call("DELETE", base)
        if status != 200 and "reclaimed" in str(truth):
            return "reclaimed"
        if status != 200 or truth.get("total_actions") != 0:
            return f"hostile check: GUI actions ran: {truth}"
        return ""

    def _env_call(self, method: str, url: str, body: Any = None) -> tuple[int, Any]:
        """One request, repeated past the injected 5xx faults and pending answers."""
        for _ in range(60):
            status, data = http_json(method, url, body, timeout=30)
            pending = isinstance(data, dict) and data.get("pending")
            if status < 500 and not pending:
                return status, data
            time.sleep(0.5)
        raise RuntimeError(f"{method} {url}: still {status} after 60 tries")

    # ---- the end ----
    def _teardown(self) -> None:
        with contextlib.suppress(Exception):
            if self.job.ids and self.job.status() not in TERMINAL:
                self.job.stop()
        self.job.save_logs()
        with contextlib.suppress(Exception):  # sessions of killed workers expire (20 s)
            wait_for(lambda: self.env.open_sessions() == 0, 90, "sessions reclaimed", 2.0)
        with contextlib.suppress(Exception):
            self.report.env_faults = self.env.fired()
        self.report.leaked_sessions = max(0, self.env.open_sessions())
        self.env.stop()
        self.cluster.stop()
        with contextlib.suppress(Exception):  # browsers need a moment to follow their server
            wait_for(lambda: not browser_pids(self.marker), 30, "browsers gone", 1.0)
        orphans = browser_pids(self.marker)
        if orphans:
            self.report.problems.append(f"{len(orphans)} browser processes outlived the soak")
            self.report.leaked_sessions += len(orphans)
            for pid in orphans:  # not to leave them on the machine
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)

    def _audit(self) -> None:
        from train_loops.jsonl import read_jsonl
        from workflows.online_rl.accounting import audit_run
        from workflows.online_rl.rl_phases import resume_point

        r = self.report
        done = [e for e in r.fault_log if e.get("ok")]
        r.fault_kinds = sorted(
            {e["kind"] for e in done} | ({"env_faults"} if r.env_faults else set())
        )
        r.faults = len(done) + r.env_faults
        if not (self.run_dir / "config.yaml").exists():
            r.problems.append("the job never started: nothing to audit")
            return
        point = resume_point(self.run_dir)
        acc = audit_run(self.run_dir, point.checkpoint, self._samples_per_step())
        r.lost_groups, r.duplicate_groups = len(acc.lost_groups), len(acc.duplicate_groups)
        r.outcomes, r.groups_started = dict(acc.outcomes), acc.groups_started
        r.optimizer_steps, r.trained_samples = acc.optimizer_steps, acc.trained_samples
        r.problems += acc.problems
        if acc.lost_groups:
            r.problems.append(f"lost groups: {acc.lost_groups[:10]}")
        if point.checkpoint and point.step != acc.optimizer_steps:
            r.problems.append(
                f"the final checkpoint is at step {point.step} but its lineage has "
                f"{acc.optimizer_steps} steps"
            )
        backwards = [
            (a, b) for a, b in zip(r.versions_seen, r.versions_seen[1:], strict=False) if b < a
        ]
        if backwards:
            r.problems.append(f"the served version went backwards: {backwards[:5]}")
        mem = [
            x.get("mem/peak_job_pss_gb", 0.0) for x in read_jsonl(self.run_dir / "metrics.jsonl")
        ]
        r.peak_memory_gb = round(max(mem, default=0.0), 2)
        if r.peak_memory_gb > self.cfg.memory_budget_gb:
            r.problems.append(f"peak memory {r.peak_memory_gb} GiB > {self.cfg.memory_budget_gb}")
        if r.hostile_refused != r.hostile_sent:
            r.problems.append(f"{r.hostile_sent - r.hostile_refused} hostile commands not refused")

    def _samples_per_step(self) -> int | None:
        """Samples every step trains; None under rollout batches (dynamic sizes)."""
        import yaml

        trainer = yaml.safe_load((self.run_dir / "config.yaml").read_text())["trainer"]
        if trainer.get("schedule") == "rollout_batch":
            return None
        return int(trainer["samples_per_step"])


def run_soak(cfg: SoakConfig) -> SoakReport:
    return Soak(cfg).run()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=15.0, help="Soak time after the job is up.")
    p.add_argument("--seed", type=int, default=0, help="Seed of the fault schedule.")
    p.add_argument("--out", type=Path, default=SoakConfig.out, help="Folder for the run.")
    p.add_argument("--short", action="store_true", help="Every process-level fault kind once.")
    p.add_argument("--env-fault-rate", type=float, default=0.05)
    p.add_argument("--every-s", type=float, default=60.0, help="Seconds between process faults.")
    p.add_argument("--memory-budget-gb", type=float, default=8.0)
    a = p.parse_args(argv)
    cfg = SoakConfig(
        minutes=a.minutes, seed=a.seed, out=a.out, short=a.short, env_fault_rate=a.env_fault_rate,
        every_s=a.every_s, memory_budget_gb=a.memory_budget_gb,
        log=lambda s: print(s, flush=True),
    )  # fmt: skip
    report = run_soak(cfg)
    r = report
    print(
        f"soak: {r.elapsed_s / 60:.1f} min, {len(r.fault_log)} process faults "
        f"({', '.join(sorted({e['kind'] for e in r.fault_log}))}) + {r.env_faults} environment "
        f"faults; {r.groups_started} groups: {r.outcomes}; {r.optimizer_steps} optimizer steps, "
        f"{r.trained_samples} samples; versions {min(r.versions_seen, default=0)}→"
        f"{max(r.versions_seen, default=0)}; hostile {r.hostile_refused}/{r.hostile_sent} "
        f"refused; peak memory {r.peak_memory_gb} GiB"
    )
    for problem in r.problems:
        print(f"soak: problem: {problem}")
    print(r.last_line())
    return 0 if r.passed else 1


if __name__ == "__main__":
    sys.exit(main())
