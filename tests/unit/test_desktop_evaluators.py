"""Setup steps, getters, metrics and the evaluator, against our real in-desktop server (run
without a display: its file and command routes need none) and real xlsx/docx files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from env_client.desktop import metrics
from env_client.desktop.evaluate import evaluate
from env_client.desktop.experts import BUILTIN_ROOT
from env_client.desktop.setup import Context, SetupError, run_steps
from env_client.desktop.tasks import load_task
from env_client.desktop.vmclient import DesktopApiError, VMClient

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "test-token"


@pytest.fixture
def desk(tmp_path: Path) -> Iterator[Context]:
    """Our in-desktop server on a session folder, and an evaluation context for it."""
    root = tmp_path / "session"
    (root / "home").mkdir(parents=True)
    ready = tmp_path / "ready.json"
    env = dict(os.environ, HOME=str(root / "home"), CSD_DESKTOP_TOKEN=TOKEN, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "env_client.desktop.vmserver", "--display=:none", f"--root={root}",
         "--width=800", "--height=600", f"--ready-file={ready}"],
        env=env, cwd=root / "home",
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
            time.sleep(0.05)
        client = VMClient(json.loads(ready.read_text())["url"], 10, TOKEN)
        yield Context(client, [BUILTIN_ROOT], tmp_path / "cache", window_wait_s=0.5)
    finally:
        proc.terminate()
        proc.wait(10)


def _task(domain: str, tid: str) -> dict:
    return load_task(BUILTIN_ROOT / domain / f"{tid}.json")


def _no_gui(task: dict) -> list[dict]:
    """The task's setup steps that need no display (uploads, commands)."""
    return [s for s in task["config"] if s["type"] in ("upload_file", "execute", "command")]


def _sh(ctx: Context, command: str) -> None:
    assert ctx.client.execute(command, shell=True)["returncode"] == 0


@pytest.mark.parametrize(
    ("domain", "tid", "right", "wrong"),
    [
        ("os", "os-make-folder", "mkdir -p ~/projects/alpha", "mkdir -p ~/projects/beta"),
        ("os", "os-write-file", "printf 'Hello, desktop!\\n' > ~/hello.txt", "echo hello > ~/hello.txt"),
        ("os", "os-rename-file", "cd ~/Documents && mv report-draft.txt report-final.txt",
         "cd ~/Documents && cp report-draft.txt report-final.txt"),
        ("os", "os-delete-logs", "rm -f ~/work/*.log && touch ~/work/keep.txt", "rm ~/work/keep.txt ~/work/a.log"),
        ("os", "os-count-lines", "echo 7 > ~/Documents/count.txt", "echo 6 > ~/Documents/count.txt"),
        ("os", "os-make-executable", "chmod +x ~/run.sh", "chmod 600 ~/run.sh"),
        ("os", "os-write-csv", "printf 'name,score\\nann,3\\nbob,5\\n' > ~/data.csv",
         "printf 'name,score\\nann,3\\n' > ~/data.csv"),
        ("text_editor", "te-sort-lines", "printf 'apple\\nfig\\npear\\n' > ~/Documents/fruits.txt",
         "printf 'pear\\nfig\\napple\\n' > ~/Documents/fruits.txt"),
    ],
)  # fmt: skip
def test_evaluators_score_right_work_1_and_wrong_work_0(
    desk: Context, domain: str, tid: str, right: str, wrong: str
) -> None:
    task = _task(domain, tid)
    run_steps(desk, _no_gui(task))
    assert evaluate(desk, task, "DONE").score == 0.0  # nothing done yet
    _sh(desk, wrong)
    assert evaluate(desk, task, "DONE").score == 0.0
    _sh(desk, right)
    assert evaluate(desk, task, "DONE").score == 1.0
    assert evaluate(desk, task, "FAIL").score == 0.0  # giving up on a feasible task


def test_infeasible_scores_only_a_fail_answer(desk: Context) -> None:
    task = _task("os", "os-infeasible-bluetooth")
    assert evaluate(desk, task, "FAIL").score == 1.0
    assert evaluate(desk, task, "DONE").score == 0.0
    assert evaluate(desk, task, None).score == 0.0


def test_files_are_confined_to_the_session_folder(desk: Context) -> None:
    with pytest.raises(DesktopApiError, match="outside the session folder"):
        desk.client.upload("/tmp/escaped.txt", b"x")
    with pytest.raises(DesktopApiError, match="outside the session folder"):
        desk.client.upload("~/../../escaped.txt", b"x")
    assert not Path("/tmp/escaped.txt").exists()
    with pytest.raises(DesktopApiError, match="HTTP 403"):
        desk.client.get_file("/etc/hostname")
    steps = [
        {
            "type": "upload_file",
            "parameters": {"files": [{"local_path": "../../pyproject.toml", "path": "~/p"}]},
        }
    ]
    with pytest.raises(SetupError, match=r"config\[0\] \(upload_file\).*relative"):
        run_steps(desk, steps)


def test_a_failing_setup_step_is_named(desk: Context) -> None:
    steps = [{"type": "sleep", "parameters": {"seconds": 0}},
             {"type": "execute", "parameters": {"command": "exit 3", "shell": True}}]  # fmt: skip
    with pytest.raises(SetupError, match=r"config\[1\] \(execute\) failed: exit status 3"):
        run_steps(desk, steps)


def test_hostile_programs_are_refused_by_the_server(desk: Context) -> None:
    with pytest.raises(DesktopApiError, match="refused"):
        desk.client.perform("import os\nos.system('touch ~/pwned')")
    assert desk.client.get_file("~/pwned") is None


def test_the_server_wants_its_token(desk: Context) -> None:
    stranger = VMClient(desk.client.base_url, 5, token="wrong")
    with pytest.raises(DesktopApiError, match="X-Desktop-Token"):
        stranger.screen_size()


# --- office metrics on real files --------------------------------------------------------


def _xlsx(path: Path, rows: list[list]) -> str:
    openpyxl = pytest.importorskip("openpyxl")
    book = openpyxl.Workbook()
    book.active.title = "Sheet1"
    for row in rows:
        book.active.append(row)
    book.save(path)
    return str(path)


def _docx(path: Path, paragraphs: list[str], center: bool = False, page_break: bool = False,
          spacing: float | None = None) -> str:  # fmt: skip
    docx = pytest.importorskip("docx")
    from docx.enum.text import WD_ALIGN_PARAGRAPH, WD_BREAK

    document = docx.Document()
    for i, text in enumerate(paragraphs):
        p = document.add_paragraph(text)
        if center and i == 0:
            p.alignment = WD_ALIGN_PARAGRAPH.CENTER
        if page_break and i == 0:
            p.add_run().add_break(WD_BREAK.PAGE)
        if spacing:
            p.paragraph_format.line_spacing = spacing
    document.save(path)
    return str(path)


def test_compare_table(tmp_path: Path) -> None:
    want = _xlsx(tmp_path / "want.xlsx", [["Item", "Qty"], ["pen", 10]])
    same = _xlsx(tmp_path / "same.xlsx", [["Item", "Qty"], ["pen", 10.0]])
    other = _xlsx(tmp_path / "other.xlsx", [["Item", "Qty"], ["pen", 11]])
    (tmp_path / "junk.xlsx").write_bytes(b"not a zip")
    assert metrics.compare_table(same, want) == 1.0
    assert metrics.compare_table(other, want) == 0.0
    assert metrics.compare_table(str(tmp_path / "junk.xlsx"), want) == 0.0
    assert metrics.compare_table(None, want) == 0.0


def test_docx_metrics(tmp_path: Path) -> None:
    plain = _docx(tmp_path / "plain.docx", ["Title", "Body."])
    centered = _docx(tmp_path / "c.docx", ["Title", "Body."], center=True)
    broken = _docx(tmp_path / "b.docx", ["Title", "Body."], page_break=True)
    double = _docx(tmp_path / "d.docx", ["Title", "Body."], spacing=2.0)
    other = _docx(tmp_path / "o.docx", ["Title", "Other."])
    assert metrics.is_first_line_centered(centered) == 1.0
    assert metrics.is_first_line_centered(plain) == 0.0
    assert metrics.contains_page_break(broken) == 1.0
    assert metrics.contains_page_break(plain) == 0.0
    assert metrics.compare_docx_files(plain, centered) == 1.0  # text only
    assert metrics.compare_docx_files(plain, other) == 0.0
    assert (
        metrics.compare_line_spacing(
            double, _docx(tmp_path / "d2.docx", ["Title", "Body."], spacing=2.0)
        )
        == 1.0
    )
    assert metrics.compare_line_spacing(plain, double) == 0.0


def test_general_metrics() -> None:
    assert metrics.exact_match("a", {"expected": "a"}) == 1.0
    assert metrics.exact_match("b", {"expected": "a"}) == 0.0
    assert metrics.check_include_exclude("x y", {"include": ["x"], "exclude": ["z"]}) == 1.0
    assert metrics.check_include_exclude("x z", {"include": ["x"], "exclude": ["z"]}) == 0.0
    assert metrics.literal_match("A", "a", ignore_case=True) == 1.0
    assert metrics.literal_match(["a"], ["b"], type="list") == 0.0
    assert metrics.is_in_list(["a", "b"], {"expected": "b"}) == 1.0
    assert metrics.fuzzy_match("abcd", {"expected": "abcd"}) == 1.0
    assert metrics.fuzzy_match("wxyz", {"expected": "abcd"}) == 0.0
