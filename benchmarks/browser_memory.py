"""Memory of the embedded environment's browsers: the project's Chromium flags vs the same
flags without the in-process ones (network service and GPU process in the browser process).

    python benchmarks/browser_memory.py                 # 4 browsers, 3 alternating rounds
    python benchmarks/browser_memory.py --browsers 8 --rounds 2

Each round starts N Chromium + chromedriver pairs with one flag set, loads a MiniWoB task
page in each, waits for it to settle, sums the PSS of every Chromium and chromedriver process
(PSS splits shared pages between the processes that map them, so the sum is what the group
costs), then quits them and does the same with the other flag set. The last line is the ratio
of the medians: project flags ÷ baseline (below 1 is less memory).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from env_client.config import EmbeddedEnvConfig
from env_client.server.browser import CHROME_FLAGS, task_page

IN_PROCESS = ("--enable-features=NetworkServiceInProcess2", "--in-process-gpu")


def chromium_pss_mb() -> tuple[float, int]:
    """(summed PSS in MB, process count) of every Chromium/chromedriver process."""
    total_kb, count = 0, 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"chrom" not in cmd:
                continue
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total_kb += int(line.split()[1])
                    count += 1
        except OSError:  # the process ended while we looked
            continue
    return total_kb / 1024, count


def measure(
    name: str, flags: tuple[str, ...], browsers: int, cfg: EmbeddedEnvConfig, task: str
) -> float:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    before, _ = chromium_pss_mb()
    drivers = []
    try:
        for _ in range(browsers):
            options = webdriver.ChromeOptions()
            for flag in flags:
                options.add_argument(flag)
            options.binary_location = cfg.chrome_binary
            service = Service(executable_path=cfg.chromedriver)
            drivers.append(webdriver.Chrome(service=service, options=options))
        for d in drivers:
            d.get(task_page(task).as_uri())
        time.sleep(3)
        for d in drivers:
            d.execute_script("return document.readyState")
        after, processes = chromium_pss_mb()
    finally:
        for d in drivers:
            d.quit()
        time.sleep(2)
    print(
        f"  {len(flags)} flags: {after - before:7.0f} MB PSS in {processes} processes", flush=True
    )
    return after - before


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--browsers", type=int, default=4, help="browsers per measurement")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds per flag set")
    p.add_argument("--task", default="click-button", help="MiniWoB task page to load")
    args = p.parse_args(argv)
    if args.browsers < 1 or args.rounds < 1:
        p.error(f"--browsers and --rounds must be >= 1, got {args.browsers}, {args.rounds}")
    cfg = EmbeddedEnvConfig()
    baseline = tuple(f for f in CHROME_FLAGS if f not in IN_PROCESS)
    if baseline == CHROME_FLAGS:
        p.error(f"CHROME_FLAGS no longer hold the in-process flags {IN_PROCESS}")
    ours, base = [], []
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}", flush=True)
        base.append(measure("baseline", baseline, args.browsers, cfg, args.task))
        ours.append(measure("project flags", CHROME_FLAGS, args.browsers, cfg, args.task))
    m_ours, m_base = statistics.median(ours), statistics.median(base)
    print(f"baseline median {m_base:.0f} MB, project flags median {m_ours:.0f} MB "
          f"({args.browsers} browsers)")  # fmt: skip
    print(f"browser_memory: project/baseline = {m_ours / m_base:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
