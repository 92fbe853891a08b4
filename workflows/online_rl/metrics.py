"""Job metrics: one namespaced dict per report, to the console, the Ray dashboard and a PNG
(the JSONL file is :class:`train_loops.jsonl.JsonlWriter`).

Keys are namespaced (``env/…``, ``rollout/…``, ``train/…``, ``loss/…``, ``serve/…``); every
sink takes the same dict, so what the dashboard shows is what the JSONL holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


class DashboardMetrics:
    """Gauges in the Ray dashboard (Prometheus names: ``computersd_<key with _>``)."""

    def __init__(self, run_name: str) -> None:
        self.run_name = run_name
        self._gauges: dict[str, Any] = {}

    def update(self, record: Mapping[str, Any]) -> None:
        from ray.util.metrics import Gauge

        for key, value in record.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            gauge = self._gauges.get(key)
            if gauge is None:
                name = "computersd_" + key.replace("/", "_").replace(".", "_")
                gauge = self._gauges[key] = Gauge(name, description=key, tag_keys=("run",))
            gauge.set(float(value), tags={"run": self.run_name})


def tree_memory_gb() -> float:
    """Proportional set size (shared pages split between sharers), in GiB, of the job on this
    node: this process and its descendants, plus every process of the Ray session it is
    connected to (raylet, GCS and their children: workers, Serve replicas, trainer workers),
    each counted once. Under ``ray job submit`` the Ray workers are not the driver's children,
    so the driver's tree alone would miss most of the job (2.0 GiB against 7.2 GiB measured)."""
    import psutil

    me = psutil.Process()
    procs = {me, *me.children(recursive=True)}
    for root in _session_roots():
        try:
            procs |= {root, *root.children(recursive=True)}
        except psutil.NoSuchProcess:
            continue
    total = 0
    for proc in procs:
        try:
            total += proc.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied, AttributeError):
            continue
    return total / 2**30


def _session_roots() -> list[Any]:
    """The raylet and GCS processes of the Ray session this driver is connected to (their
    command lines name the session folder); none without Ray or on another node."""
    import psutil

    try:
        import ray

        node = ray._private.worker.global_worker.node
        if node is None:
            return []
        session = node.get_session_dir_path()
    except Exception:  # no Ray, not connected, or the private API moved: the tree alone
        return []
    roots = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        name, cmd = proc.info["name"] or "", proc.info["cmdline"] or []
        if name in ("raylet", "gcs_server") and any(session in arg for arg in cmd):
            roots.append(proc)
    return roots


def progress_line(rec: Mapping[str, Any]) -> str:
    def g(key: str, fmt: str = "{:.3g}") -> str:
        v = rec.get(key)
        return "-" if v is None else fmt.format(v)

    return (
        f"[{g('time/elapsed_s', '{:.0f}')}s] step {g('train/step', '{:.0f}')} "
        f"v{g('serve/policy_version', '{:.0f}')} | episodes {g('rollout/episodes', '{:.0f}')} "
        f"success {g('rollout/success_rate', '{:.2f}')} | env {g('env/steps_per_s', '{:.2f}')} st/s "
        f"| lag {g('rollout/mean_version_lag', '{:.2f}')} | loss pg {g('loss/pg')} "
        f"sd {g('loss/sd')} gate {g('sd/gate_mean', '{:.2f}')} | idle {g('train/idle_frac', '{:.2f}')} "
        f"| mem {g('mem/job_pss_gb', '{:.1f}')} GiB"
    )


def learning_curve_png(records: list[dict[str, Any]], out: str | Path, title: str) -> Path:
    """Success rate, losses and version lag over wall-clock time, one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("success rate", ["rollout/success_rate", "rollout/window_success_rate"]),
        ("weights version", ["train/version", "serve/policy_version"]),
        ("losses", ["loss/pg", "loss/sd", "loss/kl"]),
        ("env steps/s", ["env/steps_per_s"]),
        ("self-distillation", ["sd/gate_mean", "sd/frac_masked"]),
        ("policy entropy", ["policy/entropy"]),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(13, 6.5))
    for ax, (label, keys) in zip(axes.flat, panels, strict=True):
        drawn = False
        for key in keys:
            pts = [
                (r["time/elapsed_s"], r[key]) for r in records if key in r and "time/elapsed_s" in r
            ]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, marker=".", linewidth=1, label=key)
                drawn = True
        if drawn:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("seconds")
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
