"""Desktop backend figures: start time, Calc reset time, steps/s and MiB per desktop, with 1
and 4 concurrent local desktops (Xvfb + openbox + LibreOffice Calc + our in-desktop server).

    python benchmarks/desktop_env.py                     # 1 and 4 desktops, 30 steps each
    python benchmarks/desktop_env.py --desktops 1 --steps 50 --json out.json

A step is what the server does for one agent action: the action goes through the whitelist to
the desktop's ``/execute`` (a real key press in Calc, moving the cell cursor), then a fresh
screenshot and window tree come back. Reset = snapshot revert (apps killed, fresh HOME) plus
the Calc task's setup (upload the sheet, open it in Calc, wait for its window). Memory is the
proportional set size (PSS) of every process of a desktop (X server, WM, in-desktop server,
apps), summed, so shared libraries count once across desktops. Goals (issue 14): reset
<= 5 s for a Calc task, >= 1 step/s per desktop with 4 desktops on 2 cores, <= 400 MiB per
desktop. Needs ``scripts/setup_desktop.sh``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from env_client.commands import KeysOp
from env_client.desktop.backend import DesktopBackend
from env_client.desktop.config import DesktopConfig
from env_client.desktop.experts import builtin_tasks
from env_client.desktop.local import missing_binaries

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


def measure(n: int, steps: int, root: str) -> dict[str, Any]:
    task = next(t for t in builtin_tasks("train") if t["task"] == TASK_ID)
    cfg = DesktopConfig(root=root)
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


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--desktops", type=int, nargs="+", default=[1, 4])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--json", type=Path, help="Also write the figures here.")
    args = p.parse_args(argv)
    missing = missing_binaries(DesktopConfig())
    if missing:
        sys.exit(f"missing {missing}: run scripts/setup_desktop.sh")
    rows = []
    with tempfile.TemporaryDirectory(prefix="csd-bench-") as root:
        for n in args.desktops:
            row = measure(n, args.steps, root)
            rows.append(row)
            print(json.dumps(row), flush=True)
    for row in rows:
        verdict = {
            k: ("ok" if (row[k] <= v if k != "steps_per_s" else row[k] >= v) else "MISSED")
            for k, v in GOALS.items()
        }
        print(
            f"{row['desktops']} desktop(s): "
            + ", ".join(f"{k} {row[k]} {verdict[k]}" for k in GOALS)
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
