"""Typed configuration of the environment client, the embedded server and the task list.

Pydantic only (no torch, no ray, no aiohttp), so ``--help``, job builders and tests load fast.
Defaults follow ../shared/ENV_PROTOCOL.md (timeouts, retry policy, heartbeat cadence).
"""

from __future__ import annotations

import itertools
import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from env_client.desktop.config import DesktopConfig

# setTimeout() delays above 2**31-1 ms overflow and fire at once, so MiniWoB's episode timer can
# be lifted to at most ~24.8 days.
MAX_EPISODE_TIME_S = (2**31 - 1) // 1000

DEFAULT_CHROME_BINARY = "/usr/bin/chromium"
DEFAULT_CHROMEDRIVER = "/usr/bin/chromedriver"


class RetryConfig(BaseModel):
    """Retries of 502/503/504 answers and transport errors (exponential backoff with jitter)."""

    model_config = ConfigDict(extra="forbid")

    backoff_base_s: float = Field(0.5, gt=0, description="First backoff delay, seconds.")
    backoff_cap_s: float = Field(20.0, gt=0, description="Largest backoff delay, seconds.")
    max_tries: int = Field(12, ge=1, le=100, description="Attempts per call, the first included.")
    recovery_deadline_s: float = Field(
        600.0, gt=0, description="Overall time one call may spend retrying and polling, seconds."
    )
    max_poll_interval_s: float = Field(
        10.0, gt=0, description="Cap on a server's retry_after_seconds while polling pending."
    )


class TimeoutsConfig(BaseModel):
    """Per-request timeouts, seconds (one HTTP attempt; retries get a fresh timeout)."""

    model_config = ConfigDict(extra="forbid")

    allocate_s: float = Field(60.0, gt=0, description="One allocate request.")
    reset_s: float = Field(120.0, gt=0, description="One reset request.")
    step_s: float = Field(120.0, gt=0, description="One step request.")
    observe_s: float = Field(60.0, gt=0, description="One observe request.")
    evaluate_s: float = Field(120.0, gt=0, description="One evaluate request.")
    heartbeat_s: float = Field(10.0, gt=0, description="One heartbeat request.")
    release_s: float = Field(30.0, gt=0, description="Whole release, retries included.")
    debug_s: float = Field(30.0, gt=0, description="One ground-truth (debug) request.")


class FaultRule(BaseModel):
    """One injected fault of the embedded server (tests of client recovery over real HTTP).

    A rule matches requests of ``op`` (and of ``session_id`` if set). The first ``skip`` matches
    pass through; the next ``times`` matches get the fault. ``phase="before"``: the server does
    not perform the operation; ``"after"``: it performs it (and records its idempotent answer),
    then answers with the fault instead, as if the answer was lost on the way.
    """

    model_config = ConfigDict(extra="forbid")

    op: Literal[
        "allocate", "reset", "step", "observe", "evaluate", "heartbeat", "release", "any"
    ] = Field(description="Operation the rule applies to ('any': every operation).")
    kind: Literal[
        "http_502", "http_503", "http_504", "delay", "lose_session", "kill_browser", "pending"
    ] = Field(
        description="http_5xx: answer that status; delay: hold the answer delay_s (a client with "
        "a shorter timeout sees a timeout); lose_session: the service drops the session (410 from "
        "then on); kill_browser: the session's Chromium really dies (the operation then fails "
        "and the desktop is replaced); pending: answer pending with the request's "
        "Idempotency-Key."
    )
    phase: Literal["before", "after"] = Field("before", description="Fault before or after acting.")
    times: int = Field(1, ge=1, description="How many matching requests get the fault.")
    skip: int = Field(0, ge=0, description="Matching requests let through before the fault.")
    session_id: str | None = Field(None, description="Only this session (None: any session).")
    delay_s: float = Field(0.0, ge=0, le=600, description="Hold time for kind='delay', seconds.")
    rate: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Share of the matching requests (past `skip`) that get the fault, drawn from "
        "a generator seeded by `seed` (a soak's 5% of operations: rate=0.05, times large).",
    )
    seed: int = Field(0, description="Seed of this rule's draws when rate < 1 (reproducible).")


def _env_or(name: str, default: str) -> str:
    return os.environ.get(name) or default


class EmbeddedEnvConfig(BaseModel):
    """The embedded environment server: MiniWoB++ in headless Chromium (one browser per
    session), or real desktops (``backend="desktop"``: one X desktop or OSWorld machine per
    session, see ``desktop``)."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["miniwob", "desktop"] = Field(
        "miniwob", description="miniwob: MiniWoB++ pages in Chromium; desktop: real desktops."
    )
    desktop: DesktopConfig = Field(
        default_factory=DesktopConfig, description="The desktop backend (backend='desktop')."
    )
    host: str = Field("127.0.0.1", description="Interface to bind.")
    port: int = Field(0, ge=0, le=65535, description="TCP port; 0 picks a free one.")
    capacity: int = Field(4, ge=1, le=64, description="Most browsers (= live sessions) at once.")
    prewarm: int = Field(1, ge=0, description="Browsers started before the server says ready.")
    screen_width: int = Field(160, ge=32, le=4096, description="Screenshot width, pixels.")
    screen_height: int = Field(210, ge=32, le=4096, description="Screenshot height, pixels.")
    heartbeat_timeout_s: float = Field(
        120.0, gt=0, description="A session without heartbeat for this long is reclaimed."
    )
    reclaim_interval_s: float = Field(1.0, gt=0, description="How often expiry is checked, s.")
    step_delay_s: float = Field(
        0.0, ge=0, le=60, description="Extra latency per step, emulating a slow desktop, s."
    )
    max_pause_s: float = Field(30.0, ge=0, description="Cap on a step's requested pause, s.")
    episode_time_limit_s: int = Field(
        86400,
        ge=1,
        le=MAX_EPISODE_TIME_S,
        description="MiniWoB's episode timer (10 s upstream), lifted so slow policies are not cut off.",
    )
    scroll_px_per_click: int = Field(
        50, ge=1, le=1000, description="Page pixels one pyautogui scroll click moves."
    )
    idempotency: bool = Field(
        True, description="Advertise operation_idempotency=1 and replay answers by key."
    )
    idempotency_cache: int = Field(
        64, ge=1, le=10000, description="Answers remembered per session for key replays."
    )
    long_op_wait_s: float = Field(
        60.0, gt=0, description="A keyed operation running longer answers 'pending', s."
    )
    allocate_retry_after_s: float = Field(
        1.0, gt=0, description="retry_after_seconds in a pending allocate answer."
    )
    waiter_ttl_s: float = Field(
        30.0,
        gt=0,
        description="An allocate waiter that stops polling is forgotten after, s. Keep it at "
        "least twice the longest client poll interval (the authors' client polls up to ~10.5 s "
        "apart), or a waiter loses its place in the queue between two polls.",
    )
    reload_every: int = Field(
        50, ge=1, description="Reload the task page every this many resets (leaks, stale state)."
    )
    browser_start_timeout_s: float = Field(60.0, gt=0, description="One browser start, s.")
    max_body_bytes: int = Field(
        1 << 20,
        ge=1024,
        le=64 << 20,
        description="Largest request body; a longer one is refused with 413 before it is read "
        "or parsed (requests carry actions and task payloads, never images).",
    )
    chrome_binary: str = Field(
        default_factory=lambda: _env_or("MINIWOB_CHROME_BINARY", DEFAULT_CHROME_BINARY),
        description="Chromium binary (env MINIWOB_CHROME_BINARY).",
    )
    chromedriver: str = Field(
        default_factory=lambda: _env_or("MINIWOB_CHROMEDRIVER", DEFAULT_CHROMEDRIVER),
        description="chromedriver binary (env MINIWOB_CHROMEDRIVER).",
    )
    fault_api: bool = Field(False, description="Serve /v1/faults (tests only).")
    faults: list[FaultRule] = Field(default_factory=list, description="Faults armed at start.")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Logging.")

    @model_validator(mode="after")
    def _prewarm_fits(self) -> EmbeddedEnvConfig:
        if self.prewarm > self.capacity:
            raise ValueError(f"prewarm={self.prewarm} exceeds capacity={self.capacity}")
        return self


class EnvClientConfig(BaseModel):
    """How the rollout side reaches GUI environments (ENV_PROTOCOL.md)."""

    model_config = ConfigDict(extra="forbid")

    server_url: str | None = Field(
        default_factory=lambda: os.environ.get("GUI_ENV_SERVER_URL") or None,
        description="Environment service (master) URL; default env GUI_ENV_SERVER_URL; "
        "None: EnvClient starts the embedded server described by `embedded`.",
    )
    runtime: str = Field("osworld", description="The 'runtime' field of an allocate request.")
    heartbeat_interval_s: float = Field(30.0, gt=0, description="Heartbeat period, seconds.")
    allocate_deadline_s: float = Field(
        300.0, gt=0, description="Overall wait for a free desktop (pending polls), seconds."
    )
    max_connections: int = Field(
        256,
        ge=1,
        description="Connection pool size; well above 2 x sessions so heartbeats "
        "never queue behind slow steps.",
    )
    timeouts: TimeoutsConfig = Field(default_factory=TimeoutsConfig)
    retry: RetryConfig = Field(default_factory=RetryConfig)
    embedded: EmbeddedEnvConfig = Field(default_factory=EmbeddedEnvConfig)
    embedded_start_timeout_s: float = Field(
        120.0, gt=0, description="Wait for the embedded server to come up, seconds."
    )


class SeedRange(BaseModel):
    """A contiguous block of MiniWoB seeds."""

    model_config = ConfigDict(extra="forbid")

    start: int = Field(ge=0, description="First seed.")
    count: int = Field(ge=1, le=1_000_000, description="Number of seeds.")


class SplitSpec(BaseModel):
    """One split: which tasks, with which seeds."""

    model_config = ConfigDict(extra="forbid")

    seeds: SeedRange
    tasks: list[str] = Field(min_length=1, description="Task names (keys of `tasks`).")


class MiniWoBTaskSpec(BaseModel):
    """One MiniWoB task of the list."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["click", "type", "checkbox", "tab", "dialog", "link", "select"] = Field(
        description="Task family, for per-domain success rates."
    )
    description: str = Field(
        min_length=1, description="Generic instruction; the concrete one comes with reset."
    )
    min_steps: int = Field(1, ge=1, le=20, description="Actions an expert needs (typical).")


class TaskListConfig(BaseModel):
    """The task list file (env_client/tasks/miniwob.yaml)."""

    model_config = ConfigDict(extra="forbid")

    env: Literal["miniwob"] = "miniwob"
    tasks: dict[str, MiniWoBTaskSpec]
    splits: dict[str, SplitSpec]

    @model_validator(mode="after")
    def _check_splits(self) -> TaskListConfig:
        for name, split in self.splits.items():
            unknown = sorted(set(split.tasks) - set(self.tasks))
            if unknown:
                raise ValueError(f"split {name!r} names unknown tasks {unknown}")
        ranges = sorted(
            (s.seeds.start, s.seeds.start + s.seeds.count, n) for n, s in self.splits.items()
        )
        for (_, end, a), (start, _, b) in itertools.pairwise(ranges):
            if start < end:
                raise ValueError(f"splits {a!r} and {b!r} share seeds")
        return self
