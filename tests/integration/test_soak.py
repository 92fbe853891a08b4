"""The short soak: the embedded job under `ray job submit` semantics on a Ray cluster of its
own, hit by every process-level fault kind once (rollout worker, policy and analyzer replicas,
a trainer worker, the environment server, ``ray job stop`` + resubmission) while the
environment server injects 5% faults, then audited from its run folder (benchmarks/soak.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.soak import KINDS, SoakConfig, run_soak

pytestmark = pytest.mark.integration


@pytest.mark.timeout(1800)
def test_short_soak_loses_nothing(tmp_path: Path) -> None:
    lines: list[str] = []
    report = run_soak(SoakConfig(minutes=1.0, short=True, out=tmp_path, log=lines.append))
    log = "\n".join(lines + report.problems)
    assert [e["kind"] for e in report.fault_log if e["ok"]] != [], log
    assert {e["kind"] for e in report.fault_log if e["ok"]} == set(KINDS), log
    assert all("recovered_s" in e for e in report.fault_log), log  # the loop worked after each
    assert report.env_faults > 0, log
    assert (report.lost_groups, report.duplicate_groups, report.leaked_sessions) == (0, 0, 0), log
    assert not report.crashed and not report.problems, log
    assert report.trained_samples == report.optimizer_steps * 8 > 0
    assert report.outcomes.get("trained", 0) > 0
    assert report.hostile_sent > 0 and report.hostile_refused == report.hostile_sent
    assert report.versions_seen == sorted(report.versions_seen) and report.versions_seen
    assert report.last_line() == (
        f"soak: faults={report.faults} lost_groups=0 duplicate_groups=0 leaked_sessions=0 "
        "crashed=no"
    )
