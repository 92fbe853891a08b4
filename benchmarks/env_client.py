"""Environment steps per second: our client vs raw aiohttp calls, and 1/2/4 concurrent sessions.

    python benchmarks/env_client.py                      # starts an embedded server (capacity 4)
    python benchmarks/env_client.py --url http://host:port --steps 200 --concurrency 1 2

Client and raw calls drive the *same* session of the same server in short alternating blocks
(so browser, machine load and drift hit both alike); each step is a real pyautogui move with a
fresh screenshot and accessibility tree in the answer. Raw calls do the minimum a caller must
(POST with an Idempotency-Key, read and parse the JSON); the client adds its envelope checks,
retry bookkeeping and screenshot decoding. Then 1, 2 and 4 sessions step concurrently through
one client. The last line states the client/raw ratio against the target (>= 0.9x).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

# The checkout root goes first: this script is itself named env_client.py, and Python puts
# its own folder on sys.path, which would otherwise shadow the env_client package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp

from env_client.client import EnvClient, Session
from env_client.config import EmbeddedEnvConfig, EnvClientConfig
from env_client.server import start_embedded_server

TASK = {"id": "bench", "instruction": "bench", "env": "miniwob", "task": "click-test", "seed": 1}
TARGET = 0.9


def _move(i: int) -> dict[str, Any]:
    # Moves over the instruction bar: real pointer actions that never end the episode.
    x, y = (20 + 7 * (i % 16), 10 + 2 * (i % 10))
    return {
        "kind": "gui",
        "type": "pyautogui",
        "payload": {"command": f"pyautogui.moveTo({x}, {y})"},
    }


async def client_steps(s: Session, n: int, offset: int = 0) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        res = await s.step(_move(offset + i))
        assert res.observation.has_screenshot
    return time.perf_counter() - t0


async def raw_steps(http: aiohttp.ClientSession, s: Session, n: int) -> float:
    url = f"{s.node_url}/v1/sessions/{s.session_id}/step"
    t0 = time.perf_counter()
    for i in range(n):
        headers = {"Idempotency-Key": f"step-{uuid.uuid4().hex}"}
        async with http.post(url, json={"action": _move(i), "pause": 0.0}, headers=headers) as r:
            data = await r.json()
        assert r.status == 200 and data["ok"] and data["observation"]["modalities"]["screenshot"]
    return time.perf_counter() - t0


async def compare(client: EnvClient, steps: int, block: int) -> tuple[float, float]:
    """(client steps/s, raw steps/s): ``steps`` each, in short alternating blocks on one
    session, so load changes on a shared machine hit both sides alike."""
    async with client.session() as s, aiohttp.ClientSession() as http:
        await s.reset(TASK)
        await client_steps(s, 10)  # warm-up: connections, caches, page state
        await raw_steps(http, s, 10)
        t_client = t_raw = 0.0
        rounds = max(1, steps // block)
        for r in range(rounds):
            if r % 2:  # alternate which side goes first
                t_client += await client_steps(s, block, offset=r)
                t_raw += await raw_steps(http, s, block)
            else:
                t_raw += await raw_steps(http, s, block)
                t_client += await client_steps(s, block, offset=r)
    n = block * rounds
    return n / t_client, n / t_raw


async def concurrent(client: EnvClient, sessions: int, seconds: float) -> float:
    """Total steps/s of ``sessions`` sessions stepping in parallel for ``seconds``."""

    async def worker(k: int, start: asyncio.Event, stop: list[bool]) -> int:
        async with client.session() as s:
            await s.reset({**TASK, "seed": k})
            await client_steps(s, 3)
            ready.append(k)
            await start.wait()
            count = 0
            while not stop[0]:
                await s.step(_move(count))
                count += 1
            return count

    ready: list[int] = []
    start, stop = asyncio.Event(), [False]
    tasks = [asyncio.ensure_future(worker(k, start, stop)) for k in range(sessions)]
    while len(ready) < sessions:
        await asyncio.sleep(0.05)
        for t in tasks:
            if t.done() and t.exception():
                raise t.exception()  # type: ignore[misc]
    start.set()
    t0 = time.perf_counter()
    await asyncio.sleep(seconds)
    stop[0] = True
    counts = await asyncio.gather(*tasks)
    return sum(counts) / (time.perf_counter() - t0)


async def main_async(args: argparse.Namespace, url: str) -> dict[str, Any]:
    cfg = EnvClientConfig(server_url=url, allocate_deadline_s=120)
    async with EnvClient(cfg) as client:
        client_rate, raw_rate = await compare(client, args.steps, args.block)
        print(f"steps/s client: {client_rate:.2f}")
        print(f"steps/s raw aiohttp: {raw_rate:.2f}")
        results: dict[str, Any] = {"client_steps_s": client_rate, "raw_steps_s": raw_rate}
        for n in args.concurrency:
            rate = await concurrent(client, n, args.seconds)
            results[f"concurrent_{n}_steps_s"] = rate
            print(f"steps/s with {n} concurrent session(s): {rate:.2f} total, {rate / n:.2f} each")
    results["ratio"] = client_rate / raw_rate
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", help="Existing server; default: start an embedded one.")
    p.add_argument("--steps", type=int, default=300, help="Timed steps per side (client, raw).")
    p.add_argument("--block", type=int, default=5, help="Steps per alternating block.")
    p.add_argument("--concurrency", type=int, nargs="*", default=[1, 2, 4])
    p.add_argument("--seconds", type=float, default=10.0, help="Duration of each concurrency run.")
    p.add_argument("--step-delay-s", type=float, default=0.0, help="Embedded server latency.")
    p.add_argument("--json", type=Path, help="Also write the numbers here.")
    args = p.parse_args()
    server = None
    if args.url is None:
        cap = max([*args.concurrency, 1])
        cfg = EmbeddedEnvConfig(capacity=cap, prewarm=cap, step_delay_s=args.step_delay_s)
        t0 = time.perf_counter()
        server = start_embedded_server(cfg, timeout_s=300)
        print(
            f"embedded server {server.url}: {cap} browsers up in {time.perf_counter() - t0:.1f} s"
        )
    try:
        results = asyncio.run(main_async(args, args.url or server.url))  # type: ignore[union-attr]
    finally:
        if server is not None:
            server.stop()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    print(f"client/raw: {results['ratio']:.2f}x (target >= {TARGET}x)")


if __name__ == "__main__":
    main()
