"""Bounded fuzzing of every HTTP surface we serve: the environment server, the OpenAI endpoint
and the demo app.

    python benchmarks/fuzz_http.py --requests 400 --seed 0   # starts all three (see below)
    python benchmarks/fuzz_http.py --env-url http://127.0.0.1:8765 --no-openai --no-demo
    python benchmarks/fuzz_http.py --openai-url http://127.0.0.1:8000/policy --no-env --no-demo
    python benchmarks/fuzz_http.py --demo-url http://127.0.0.1:8000/demo --no-env --no-openai

A surface without a URL is started here: an embedded env server, a tiny policy on Ray Serve, and
the demo's FastAPI app under uvicorn in this process (no Ray, no models; its live episode runs
on the env server of this fuzz, none with ``--no-env``; its viewer reads a temporary runs folder
holding one fuzz run). Loopback only: a URL that is not 127.0.0.1/localhost is refused. Exactly
``--requests`` probes are drawn with a seeded RNG (same seed, same probes) and sent one at a
time; then it stops. Every probe is bad input: malformed JSON, wrong types, bodies over the
server's limit (with and without Content-Length), unknown ids, routes and methods,
Idempotency-Keys replayed with a different body, pyautogui commands that try to leave the
whitelist, run names and step ids that try to leave the runs folder (``..``, ``%2e%2e``,
encoded slashes), unknown episode commands, out-of-range temperatures. Each must be answered
4xx with a JSON error that names the problem (env and demo: ``{"ok": false, "error": …}``;
OpenAI: ``{"error": {"message": …}}``), never 5xx. Afterwards every server must still be
healthy: ``/healthz`` ok, the env session still observes and has executed no GUI action, no
file a hostile probe names exists, the policy still answers a real chat completion, the demo's
``/api/status`` answers, no probe started a demo episode and the live one is still ready and
unstepped.

A probe may carry a set-up request (e.g. the first use of an Idempotency-Key, a heartbeat that
keeps the fuzzed session alive); set-ups must succeed and are not counted. The last line is
``fuzz: requests=<n> 4xx=<n> 5xx=<n> other=<n> healthy=<yes|no>`` (other: 2xx/3xx, a 4xx
without a proper JSON error, or a transport error); the exit status is 1 unless 5xx=0,
other=0 and healthy=yes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from pathlib import Path

# The probes, targets, health checks and servers live in benchmarks/http_fuzz/ (one module a
# surface); this file is the command line.

# The checkout root goes first: benchmarks/ holds a script named env_client.py, which would
# otherwise shadow the env_client package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.http_fuzz.driver import fuzz
from benchmarks.http_fuzz.env_server import started_env
from benchmarks.http_fuzz.openai_endpoint import started_policy


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--requests", type=int, default=400, help="Probes to send (default 400).")
    p.add_argument("--seed", type=int, default=0, help="RNG seed of the probes.")
    p.add_argument("--env-url", help="A running env server (default: start one here).")
    p.add_argument("--env-max-body-bytes", type=int, default=1 << 20, help="Its body limit.")
    p.add_argument("--no-env", action="store_true", help="Skip the env server.")
    p.add_argument("--openai-url", help="A running OpenAI base (…/<prefix>, without /v1).")
    p.add_argument("--model", default="policy", help="Model id served at --openai-url.")
    p.add_argument("--openai-max-body-bytes", type=int, default=64 << 20, help="Its limit.")
    p.add_argument("--no-openai", action="store_true", help="Skip the OpenAI endpoint.")
    p.add_argument(
        "--demo-url",
        help="A running demo app with its route prefix (http://127.0.0.1:8000/demo); default: "
        "serve the demo's FastAPI app here (no Ray, no models; its live episode on the env "
        "server of this fuzz, none with --no-env).",
    )
    p.add_argument("--demo-max-body-bytes", type=int, default=64 << 10, help="Its limit.")
    p.add_argument("--no-demo", action="store_true", help="Skip the demo app.")
    p.add_argument("--verbose", action="store_true", help="Print every answer.")
    args = p.parse_args(argv)
    if args.no_env and args.no_openai and args.no_demo:
        p.error("nothing to fuzz: --no-env, --no-openai and --no-demo")
    if args.requests < 1:
        p.error("--requests must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with contextlib.ExitStack() as stack:
        env = None if args.no_env else stack.enter_context(started_env(args))
        policy = None if args.no_openai else stack.enter_context(started_policy(args))
        tally, problems, healthy = asyncio.run(fuzz(args, env, policy))
    # Printed once the servers are down, so Ray's log lines cannot follow the summary.
    for line in tally.failures + problems:
        print(f"  FAIL {line}", flush=True)
    print(tally.line(healthy), flush=True)
    clean = tally.counts["5xx"] == 0 and tally.counts["other"] == 0
    return 0 if healthy and clean else 1


if __name__ == "__main__":
    sys.exit(main())
