"""Desktop backend figures: start time, Calc reset time, steps/s and MiB per desktop, with 1
and 4 concurrent local desktops (Xvfb + openbox + LibreOffice Calc + our in-desktop server).

    python benchmarks/desktop_env.py                          # through the session protocol
    python benchmarks/desktop_env.py --via backend            # DesktopBackend objects directly
    python benchmarks/desktop_env.py --desktops 4 --rounds 3 --json out.json

``--via protocol`` (default) measures what a client of the session protocol sees: the real
server (``python -m env_client.server --backend desktop``, capacity = desktops, prewarm =
desktops) and the real client; N clients run N episodes at the same instant, ``--rounds``
times. Round 1 finds the server's prewarmed desktops idle; a released desktop is closed, so
later rounds wait for desktops started on demand (allocate answers pending, the client polls
again after ``allocate_retry_after_s``). Reset = the client's ``reset`` call; ready = allocate
+ reset (from asking for a session to the first observation). ``--via backend`` is the older
measure: N DesktopBackend objects started one after the other, then reset at the same instant.

A step is what the server does for one agent action: the action goes through the whitelist to
the desktop's ``/execute`` (a real key press in Calc, moving the cell cursor), then a fresh
screenshot and window tree come back (through the protocol: also encoded and sent). Reset =
snapshot revert (apps killed, fresh HOME; nothing to revert on a fresh desktop) plus the Calc
task's setup (upload the sheet, open it in Calc, wait for its window). Memory is the
proportional set size (PSS) of every process of a desktop (X server, WM, in-desktop server,
apps), summed, so shared libraries count once across desktops; measured after the steps.
Goals (issue 14): reset <= 5 s for a Calc task, >= 1 step/s per desktop with 4 desktops on 2
cores, <= 400 MiB per desktop. Needs ``scripts/setup_desktop.sh``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from env_client.client import EnvClient
from env_client.commands import KeysOp
from env_client.config import EmbeddedEnvConfig, EnvClientConfig
from env_client.desktop.backend import DesktopBackend
from env_client.desktop.config import DesktopConfig
from env_client.desktop.experts import builtin_tasks
from env_client.desktop.local import TAG_VAR, missing_binaries
from env_client.server import start_embedded_server

TASK_ID = "calc-sum"
GOALS = {"reset_s": 5.0, "steps_per_s": 1.0, "mib_per_desktop": 400.0}


def pss_mib(pids: set[int]) -> float:
    total_kib = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total_kib += int(line.split()[1])
        except OSError:  # exited meanwhile
            continue
    return total_kib / 1024


def run_desktop(b: DesktopBackend, task: dict[str, Any], steps: int, out: dict[str, Any]) -> None:
    t0 = time.monotonic()
    b.reset(task)
    out["reset_s"] = time.monotonic() - t0
    keys = ["down", "right", "up", "left"]
    t0 = time.monotonic()
    for i in range(steps):
        b.perform([KeysOp((keys[i % 4],))])
        b.observe()
    out["steps_per_s"] = steps / (time.monotonic() - t0)


def measure(n: int, steps: int, root: str, cfg: DesktopConfig) -> dict[str, Any]:
    """--via backend: n desktops started one by one, then reset at the same instant."""
    task = next(t for t in builtin_tasks("train") if t["task"] == TASK_ID)
    backends = [DesktopBackend(cfg, i) for i in range(n)]
    results: list[dict[str, Any]] = [{} for _ in backends]
    try:
        t0 = time.monotonic()
        for b in backends:
            b.start()
        start_s = (time.monotonic() - t0) / n
        threads = [
            threading.Thread(target=run_desktop, args=(b, task, steps, r))
            for b, r in zip(backends, results, strict=True)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        mib = [pss_mib(b.local.pids()) for b in backends if b.local]
    finally:
        for b in backends:
            b.close()
    return {
        "desktops": n,
        "start_s": round(start_s, 2),
        "reset_s": round(max(r["reset_s"] for r in results), 2),
        "steps_per_s": round(min(r["steps_per_s"] for r in results), 2),
        "steps_per_s_mean": round(statistics.mean(r["steps_per_s"] for r in results), 2),
        "mib_per_desktop": round(max(mib), 1),
    }


def desktop_mib(root: str) -> dict[str, float]:
    """PSS (MiB) of every live desktop under ``root`` (cfg.root), by its tag (reads /proc)."""
    by_tag: dict[str, set[int]] = {}
    key = f"{TAG_VAR}=".encode()
    home = f"HOME={root}/".encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if not any(item.startswith(home) for item in env):
            continue  # another server's desktop
        for item in env:
            if item.startswith(key):
                by_tag.setdefault(item[len(key) :].decode(), set()).add(int(entry.name))
    return {tag: pss_mib(pids) for tag, pids in by_tag.items()}


async def protocol_episode(
    client: EnvClient,
    task: dict[str, Any],
    steps: int,
    gate: asyncio.Barrier,
    mib: dict[str, float],
    root: str,
) -> dict[str, Any]:
    keys = ["down", "right", "up", "left"]
    out: dict[str, Any] = {}
    t0 = time.monotonic()
    async with client.session() as s:
        t1 = time.monotonic()
        await s.reset(task)
        t2 = time.monotonic()
        out.update(allocate_s=t1 - t0, reset_s=t2 - t1, ready_s=t2 - t0)
        for i in range(steps):
            key = keys[i % 4]
            await s.step({"kind": "gui", "type": "PRESS", "payload": {"key": key}})
        out["steps_per_s"] = steps / (time.monotonic() - t2)
        await asyncio.wait_for(gate.wait(), 300)  # all desktops up: measure them at once
        if not mib:
            mib.update(desktop_mib(root))
        await asyncio.wait_for(gate.wait(), 300)
    return out


def measure_protocol(
    n: int, steps: int, rounds: int, root: str, cfg: DesktopConfig
) -> list[dict[str, Any]]:
    """--via protocol: the real server and client, n episodes at once, ``rounds`` times."""
    task = next(t for t in builtin_tasks("train") if t["task"] == TASK_ID)
    server_cfg = EmbeddedEnvConfig(backend="desktop", desktop=cfg, capacity=n, prewarm=n)
    client_cfg = EnvClientConfig(allocate_deadline_s=120)
    rows = []
    with start_embedded_server(server_cfg, timeout_s=120) as srv:

        async def one_round(mib: dict[str, float]) -> list[dict[str, Any]]:
            gate = asyncio.Barrier(n)
            async with EnvClient(client_cfg.model_copy(update={"server_url": srv.url})) as c:
                return await asyncio.gather(
                    *(protocol_episode(c, task, steps, gate, mib, cfg.root) for _ in range(n))
                )

        try:
            for r in range(rounds):
                mib: dict[str, float] = {}
                results = asyncio.run(one_round(mib))
                rows.append(
                    {
                        "desktops": n,
                        "round": r + 1,
                        "desktop_idle_before": r == 0,
                        "allocate_s": round(max(x["allocate_s"] for x in results), 2),
                        "reset_s": round(max(x["reset_s"] for x in results), 2),
                        "reset_s_each": sorted(round(x["reset_s"], 2) for x in results),
                        "ready_s": round(max(x["ready_s"] for x in results), 2),
                        "steps_per_s": round(min(x["steps_per_s"] for x in results), 2),
                        "mib_per_desktop": round(max(mib.values(), default=0.0), 1),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
        finally:
            # Released desktops close in the background, and a server stopped meanwhile leaves
            # them running (its shutdown cancels those closes): wait until they are gone.
            deadline = time.monotonic() + 30
            while desktop_mib(cfg.root) and time.monotonic() < deadline:
                time.sleep(0.2)
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--desktops", type=int, nargs="+", default=[1, 4])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--via", choices=("protocol", "backend"), default="protocol")
    p.add_argument("--rounds", type=int, default=2, help="--via protocol: episodes per client.")
    p.add_argument(
        "--desktop-json", default="{}", help="DesktopConfig fields to set (JSON), e.g. designs."
    )
    p.add_argument("--json", type=Path, help="Also write the figures here.")
    args = p.parse_args(argv)
    missing = missing_binaries(DesktopConfig())
    if missing:
        sys.exit(f"missing {missing}: run scripts/setup_desktop.sh")
    rows = []
    with tempfile.TemporaryDirectory(prefix="csd-bench-") as root:
        os.chmod(root, 0o711)  # a root server's desktop user must be able to enter it
        cfg = DesktopConfig(root=root, **json.loads(args.desktop_json))
        for n in args.desktops:
            if args.via == "protocol":
                rows += measure_protocol(n, args.steps, args.rounds, root, cfg)
            else:
                rows.append(measure(n, args.steps, root, cfg))
                print(json.dumps(rows[-1]), flush=True)
    for row in rows:
        verdict = {
            k: ("ok" if (row[k] <= v if k != "steps_per_s" else row[k] >= v) else "MISSED")
            for k, v in GOALS.items()
        }
        where = f" round {row['round']}" if "round" in row else ""
        print(
            f"{row['desktops']} desktop(s){where}: "
            + ", ".join(f"{k} {row[k]} {verdict[k]}" for k in GOALS)
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
