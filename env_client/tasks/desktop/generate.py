"""Writes the built-in desktop task set (OSWorld task format) beside this file.

    .venv/bin/python -m env_client.tasks.desktop.generate      # needs openpyxl, python-docx

Output (checked in; regenerate after editing the definitions below):
- ``<domain>/<id>.json``: one task config each (``id``, ``instruction``, ``config`` setup steps,
  ``evaluator``), domains ``os`` (terminal and files), ``text_editor`` (Mousepad),
  ``libreoffice_calc`` and ``libreoffice_writer``;
- ``files/<id>/``: the input files the setup uploads and the expected files evaluators compare
  with (spreadsheets and documents built with openpyxl / python-docx, so they are reproducible);
- ``train.json`` / ``eval.json``: split indexes ``{domain: [ids]}`` (OSWorld's format);
- ``experts.json``: ``{id: [{"action": ACTION, "pause": s}, ...]}``, a scripted solution per
  task; keyboard-only (it does not depend on where windows land), ending with DONE (FAIL for
  the infeasible task). Some use OSWorld ``computer_13`` actions, so both action spaces are
  exercised on real apps.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DOMAINS = ("os", "text_editor", "libreoffice_calc", "libreoffice_writer")
EVAL_PER_DOMAIN = {"os": 3, "text_editor": 2, "libreoffice_calc": 2, "libreoffice_writer": 2}

Step = dict[str, Any]


# --- helpers -----------------------------------------------------------------------------


def cmd(command: str) -> Step:
    return {"action": {"kind": "gui", "type": "pyautogui", "payload": {"command": command}}}


def c13(typ: str, **payload: Any) -> Step:
    return {"action": {"kind": "gui", "type": typ, "payload": payload}}


def pause(step: Step, seconds: float) -> Step:
    return {**step, "pause": seconds}


DONE = {"action": {"kind": "control", "type": "DONE", "payload": {}}}
FAIL = {"action": {"kind": "control", "type": "FAIL", "payload": {}}}
SAVE = pause(cmd("pyautogui.hotkey('ctrl', 's')"), 2.0)


def upload(task_id: str, name: str, path: str) -> Step:
    return {
        "type": "upload_file",
        "parameters": {"files": [{"local_path": f"files/{task_id}/{name}", "path": path}]},
    }


def open_(path: str) -> Step:
    return {"type": "open", "parameters": {"path": path}}


def shell(command: str) -> Step:
    return {"type": "execute", "parameters": {"command": command, "shell": True}}


def terminal() -> list[Step]:
    return [
        {"type": "launch", "parameters": {"command": ["xterm", "-geometry", "100x30+40+40"]}},
        {"type": "activate_window", "parameters": {"window_name": "xterm", "by_class": True}},
    ]


def vm_file(path: str, dest: str) -> dict[str, Any]:
    return {"type": "vm_file", "path": path, "dest": dest}


def local(task_id: str, name: str) -> dict[str, Any]:
    return {"type": "local_file", "path": f"files/{task_id}/{name}"}


def command_line(command: str) -> dict[str, Any]:
    return {"type": "vm_command_line", "command": command, "shell": True}


def rule(**rules: Any) -> dict[str, Any]:
    return {"type": "rule", "rules": rules}


def type_in_shell(line: str) -> Step:
    return pause(cmd(f"pyautogui.write({line + chr(10)!r})"), 0.5)


# --- task definitions --------------------------------------------------------------------

Task = dict[str, Any]


def os_tasks() -> list[tuple[Task, list[Step], dict[str, bytes]]]:
    out = []

    def add(tid: str, instr: str, config: list[Step], ev: dict[str, Any], expert: list[Step],
            files: dict[str, bytes] | None = None) -> None:  # fmt: skip
        task: dict[str, Any] = {"id": tid, "instruction": instr, "config": config, "evaluator": ev}
        task["related_apps"] = ["terminal"]
        out.append((task, expert, files or {}))

    add(
        "os-make-folder",
        "Create a folder named 'alpha' inside a new folder 'projects' in your home folder.",
        terminal(),
        {
            "func": "exact_match",
            "result": command_line("test -d ~/projects/alpha && echo present || echo absent"),
            "expected": rule(expected="present\n"),
        },
        [type_in_shell("mkdir -p ~/projects/alpha"), DONE],
    )
    add(
        "os-write-file",
        "Create the file hello.txt in your home folder containing exactly one line: "
        "Hello, desktop!",
        terminal(),
        {
            "func": "compare_text_file",
            "result": vm_file("~/hello.txt", "hello.txt"),
            "expected": local("os-write-file", "hello.txt"),
        },
        [type_in_shell("printf 'Hello, desktop!\\n' > ~/hello.txt"), DONE],
        {"hello.txt": b"Hello, desktop!\n"},
    )
    add(
        "os-rename-file",
        "Rename ~/Documents/report-draft.txt to report-final.txt (same folder).",
        [upload("os-rename-file", "report-draft.txt", "~/Documents/report-draft.txt"), *terminal()],
        {
            "func": "check_include_exclude",
            "result": command_line("ls ~/Documents"),
            "expected": rule(include=["report-final.txt"], exclude=["report-draft.txt"]),
        },
        [type_in_shell("mv ~/Documents/report-draft.txt ~/Documents/report-final.txt"), DONE],
        {"report-draft.txt": b"Quarterly numbers: draft\n"},
    )
    add(
        "os-delete-logs",
        "Delete every .log file in the folder ~/work, and keep all other files there.",
        [shell("mkdir -p ~/work && touch ~/work/a.log ~/work/b.log ~/work/keep.txt"), *terminal()],
        {
            "func": "check_include_exclude",
            "result": command_line("ls ~/work"),
            "expected": rule(include=["keep.txt"], exclude=[".log"]),
        },
        [type_in_shell("rm ~/work/*.log"), DONE],
    )
    add(
        "os-count-lines",
        "Count the lines of ~/Documents/names.txt and write just that number into "
        "~/Documents/count.txt.",
        [upload("os-count-lines", "names.txt", "~/Documents/names.txt"), *terminal()],
        {
            "func": "exact_match",
            "result": command_line("tr -d ' \\n' < ~/Documents/count.txt"),
            "expected": rule(expected="7"),
        },
        [type_in_shell("wc -l < ~/Documents/names.txt > ~/Documents/count.txt"), DONE],
        {
            "names.txt": "\n".join(["ann", "bob", "cyd", "dee", "eve", "fay", "gus"]).encode()
            + b"\n"
        },
    )
    add(
        "os-backup-copy",
        "Copy ~/Documents/notes.txt into a new folder ~/backup, keeping the original.",
        [upload("os-backup-copy", "notes.txt", "~/Documents/notes.txt"), *terminal()],
        {
            "func": "exact_match",
            "result": command_line(
                "test -f ~/Documents/notes.txt && cmp -s ~/Documents/notes.txt ~/backup/notes.txt"
                " && echo same || echo different"
            ),
            "expected": rule(expected="same\n"),
        },
        [type_in_shell("mkdir -p ~/backup && cp ~/Documents/notes.txt ~/backup/"), DONE],
        {"notes.txt": b"meeting at 10\nbring slides\n"},
    )
    add(
        "os-make-executable",
        "Make the script ~/run.sh executable.",
        [upload("os-make-executable", "run.sh", "~/run.sh"), *terminal()],
        {
            "func": "exact_match",
            "result": command_line("test -x ~/run.sh && echo yes || echo no"),
            "expected": rule(expected="yes\n"),
        },
        [type_in_shell("chmod +x ~/run.sh"), DONE],
        {"run.sh": b"#!/bin/sh\necho hi\n"},
    )
    add(
        "os-write-csv",
        "Create ~/data.csv with the header line name,score and the rows ann,3 and bob,5.",
        terminal(),
        {
            "func": "compare_csv",
            "result": vm_file("~/data.csv", "data.csv"),
            "expected": local("os-write-csv", "data.csv"),
        },
        [type_in_shell("printf 'name,score\\nann,3\\nbob,5\\n' > ~/data.csv"), DONE],
        {"data.csv": b"name,score\nann,3\nbob,5\n"},
    )
    add(
        "os-infeasible-bluetooth",
        "Turn on the computer's Bluetooth adapter and pair it with my headphones.",
        terminal(),
        {"func": "infeasible"},
        [FAIL],
    )
    return out


def editor_tasks() -> list[tuple[Task, list[Step], dict[str, bytes]]]:
    out = []

    def add(tid: str, instr: str, name: str, before: bytes, after: bytes,
            keys: list[Step], open_it: bool = True) -> None:  # fmt: skip
        path = f"~/Documents/{name}"
        config = (
            [upload(tid, name, path), open_(path)]
            if open_it
            else [
                {"type": "launch", "parameters": {"command": ["mousepad", f"Documents/{name}"]}},
                {"type": "activate_window", "parameters": {"window_name": "Mousepad"}},
            ]
        )
        files = {"expected-" + name: after}
        if open_it:
            files[name] = before
        ev = {
            "func": "compare_text_file",
            "result": vm_file(path, name),
            "expected": local(tid, "expected-" + name),
            "options": {"ignore_blanks": True},
        }
        task: dict[str, Any] = {"id": tid, "instruction": instr, "config": config, "evaluator": ev}
        task["related_apps"] = ["mousepad"]
        out.append((task, [*keys, SAVE, DONE], files))

    add(
        "te-append-line",
        "In the open to-do list, add the line 'water plants' at the end, then save the file.",
        "todo.txt",
        b"buy milk\ncall bob\n",
        b"buy milk\ncall bob\nwater plants\n",
        [cmd("pyautogui.hotkey('ctrl', 'end')"), cmd("pyautogui.write('water plants\\n')")],
    )
    add(
        "te-delete-first-line",
        "Delete the first line (DRAFT) of the open file and save it.",
        "list.txt",
        b"DRAFT\nalpha\nbeta\n",
        b"alpha\nbeta\n",
        [
            c13("HOTKEY", keys=["ctrl", "home"]),
            c13("HOTKEY", keys=["shift", "down"]),
            c13("PRESS", key="delete"),
        ],
    )
    add(
        "te-fix-spelling",
        "In the open letter, change the word 'colour' to 'color', then save.",
        "letter.txt",
        b"Dear Sam,\nthe colour is red.\n",
        b"Dear Sam,\nthe color is red.\n",
        [
            cmd("pyautogui.hotkey('ctrl', 'a')"),
            cmd("pyautogui.write('Dear Sam,\\nthe color is red.\\n')"),
        ],
    )
    add(
        "te-new-file",
        "The editor shows a new file poem.txt. Write the line 'Roses are red' in it and save it.",
        "poem.txt",
        b"",
        b"Roses are red\n",
        [c13("TYPING", text="Roses are red\n")],
        open_it=False,
    )
    add(
        "te-title-upper",
        "Change the first line of the open file to '# PROJECT' (upper case), then save.",
        "readme.md",
        b"# project\nA small tool.\n",
        b"# PROJECT\nA small tool.\n",
        [
            cmd("pyautogui.hotkey('ctrl', 'home')"),
            cmd("pyautogui.hotkey('shift', 'end')"),
            cmd("pyautogui.write('# PROJECT')"),
        ],
    )
    add(
        "te-sort-lines",
        "Sort the lines of the open file alphabetically, then save.",
        "fruits.txt",
        b"pear\napple\nfig\n",
        b"apple\nfig\npear\n",
        [cmd("pyautogui.hotkey('ctrl', 'a')"), cmd("pyautogui.write('apple\\nfig\\npear\\n')")],
    )
    return out


def _xlsx(rows: Sequence[Sequence[Any]]) -> bytes:
    import io

    import openpyxl

    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "Sheet1"
    for row in rows:
        sheet.append(row)
    buf = io.BytesIO()
    book.save(buf)
    return buf.getvalue()


def calc_tasks() -> list[tuple[Task, list[Step], dict[str, bytes]]]:
    out = []
    base: list[list[Any]] = [["Item", "Qty"], ["pen", 10], ["ink", 20], ["pad", 30]]

    def add(tid: str, instr: str, before: Sequence[Sequence[Any]], after: Sequence[Sequence[Any]],
            keys: list[Step]) -> None:  # fmt: skip
        path = "~/Documents/stock.xlsx"
        ev = {
            "func": "compare_table",
            "result": vm_file(path, "stock.xlsx"),
            "expected": local(tid, "expected.xlsx"),
        }
        task: dict[str, Any] = {
            "id": tid,
            "instruction": instr,
            "config": [upload(tid, "stock.xlsx", path), open_(path)],
            "evaluator": ev,
            "related_apps": ["libreoffice_calc"],
        }
        files = {"stock.xlsx": _xlsx(before), "expected.xlsx": _xlsx(after)}
        home = [c13("HOTKEY", keys=["ctrl", "home"])]
        out.append((task, [*home, *keys, SAVE, DONE], files))

    add(
        "calc-fill-qty",
        "In the open sheet, enter the quantities 10, 20 and 30 for pen, ink and pad in "
        "column B (Qty), then save the file in its current format.",
        [["Item", "Qty"], ["pen"], ["ink"], ["pad"]],
        base,
        [c13("PRESS", key="right"), c13("PRESS", key="down"), c13("TYPING", text="10\n20\n30\n")],
    )
    add(
        "calc-sum",
        "In the open sheet, write 'Total' in A5 and a formula in B5 that sums B2:B4, then save.",
        base,
        [*base, ["Total", 60]],
        [
            cmd("pyautogui.press('down', presses=4)"),
            cmd("pyautogui.write('Total\\t=SUM(B2:B4)\\n')"),
        ],
    )
    add(
        "calc-average",
        "In the open sheet, write 'Average' in A5 and a formula in B5 that averages B2:B4, "
        "then save.",
        base,
        [*base, ["Average", 20]],
        [
            cmd("pyautogui.press('down', presses=4)"),
            cmd("pyautogui.write('Average\\t=AVERAGE(B2:B4)\\n')"),
        ],
    )
    add(
        "calc-delete-row",
        "Delete the whole row of the item 'ink' so no empty row is left, then save.",
        base,
        [["Item", "Qty"], ["pen", 10], ["pad", 30]],
        [
            cmd("pyautogui.press('down', presses=2)"),
            cmd("pyautogui.hotkey('shift', 'space')"),
            pause(cmd("pyautogui.hotkey('ctrl', '-')"), 0.5),
        ],
    )
    add(
        "calc-price-column",
        "Add a column 'Price' in C with the prices 1.5, 2 and 0.5 for pen, ink and pad, then save.",
        base,
        [["Item", "Qty", "Price"], ["pen", 10, 1.5], ["ink", 20, 2], ["pad", 30, 0.5]],
        [
            cmd("pyautogui.press('right', presses=2)"),
            cmd("pyautogui.write('Price\\n1.5\\n2\\n0.5\\n')"),
        ],
    )
    add(
        "calc-double",
        "In column C, next to each quantity, put a formula giving twice the quantity "
        "(C2 for B2 down to C4 for B4), then save.",
        base,
        [["Item", "Qty"], ["pen", 10, 20], ["ink", 20, 40], ["pad", 30, 60]],
        [
            cmd("pyautogui.press('right', presses=2)"),
            cmd("pyautogui.press('down')"),
            cmd("pyautogui.write('=B2*2\\n=B3*2\\n=B4*2\\n')"),
        ],
    )
    return out


def _docx(paragraphs: list[str], spacing: float | None = None) -> bytes:
    import io

    import docx

    document = docx.Document()
    for text in paragraphs:
        p = document.add_paragraph(text)
        if spacing is not None:
            p.paragraph_format.line_spacing = spacing
    buf = io.BytesIO()
    document.save(buf)
    return buf.getvalue()


REPORT = ["Quarterly report", "Sales grew in all regions.", "Costs stayed flat."]


def writer_tasks() -> list[tuple[Task, list[Step], dict[str, bytes]]]:
    out = []

    def add(tid: str, instr: str, ev: dict[str, Any], keys: list[Step],
            expected: bytes | None = None) -> None:  # fmt: skip
        path = "~/Documents/report.docx"
        task: dict[str, Any] = {
            "id": tid,
            "instruction": instr,
            "config": [upload(tid, "report.docx", path), open_(path)],
            "evaluator": {"result": vm_file(path, "report.docx"), **ev},
            "related_apps": ["libreoffice_writer"],
        }
        files = {"report.docx": _docx(REPORT)}
        if expected is not None:
            files["expected.docx"] = expected
            task["evaluator"]["expected"] = local(tid, "expected.docx")
        out.append((task, [*keys, SAVE, DONE], files))

    add(
        "writer-center-title",
        "Center the first line (the title) of the open document, then save it in its format.",
        {"func": "is_first_line_centered"},
        [cmd("pyautogui.hotkey('ctrl', 'home')"), cmd("pyautogui.hotkey('ctrl', 'e')")],
    )
    add(
        "writer-page-break",
        "Insert a page break right after the title, so the body starts on a new page; save.",
        {"func": "contains_page_break"},
        [
            cmd("pyautogui.hotkey('ctrl', 'home')"),
            cmd("pyautogui.press('end')"),
            cmd("pyautogui.hotkey('ctrl', 'enter')"),
        ],
    )
    add(
        "writer-draft-line",
        "Insert a new first line 'DRAFT' above the title of the open document; save.",
        {"func": "compare_docx_files"},
        [c13("HOTKEY", keys=["ctrl", "home"]), c13("TYPING", text="DRAFT\n")],
        _docx(["DRAFT", *REPORT]),
    )
    add(
        "writer-append-paragraph",
        "Add a last paragraph saying 'Outlook is positive.' to the open document; save.",
        {"func": "compare_docx_files"},
        [
            cmd("pyautogui.hotkey('ctrl', 'end')"),
            cmd("pyautogui.press('enter')"),
            cmd("pyautogui.write('Outlook is positive.')"),
        ],
        _docx([*REPORT, "Outlook is positive."]),
    )
    add(
        "writer-delete-paragraph",
        "Delete the paragraph 'Costs stayed flat.' from the open document; save.",
        {"func": "compare_docx_files"},
        [
            cmd("pyautogui.hotkey('ctrl', 'end')"),
            cmd("pyautogui.hotkey('shift', 'home')"),
            cmd("pyautogui.press('delete')"),
            cmd("pyautogui.press('backspace')"),
        ],
        _docx(REPORT[:2]),
    )
    add(
        "writer-retitle",
        "Change the title of the open document to 'Annual report', then save.",
        {"func": "compare_docx_files"},
        [
            cmd("pyautogui.hotkey('ctrl', 'home')"),
            cmd("pyautogui.hotkey('shift', 'end')"),
            c13("TYPING", text="Annual report"),
        ],
        _docx(["Annual report", *REPORT[1:]]),
    )
    return out


# --- writing -----------------------------------------------------------------------------


def all_tasks() -> dict[str, list[tuple[Task, list[Step], dict[str, bytes]]]]:
    return {
        "os": os_tasks(),
        "text_editor": editor_tasks(),
        "libreoffice_calc": calc_tasks(),
        "libreoffice_writer": writer_tasks(),
    }


def _dump(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def main() -> None:
    for folder in (*DOMAINS, "files"):
        shutil.rmtree(HERE / folder, ignore_errors=True)
    experts: dict[str, list[Step]] = {}
    splits: dict[str, dict[str, list[str]]] = {"train": {}, "eval": {}}
    for domain, tasks in all_tasks().items():
        ids = [t["id"] for t, _, _ in tasks]
        n_eval = EVAL_PER_DOMAIN[domain]
        splits["train"][domain], splits["eval"][domain] = ids[:-n_eval], ids[-n_eval:]
        for task, expert, files in tasks:
            _dump(HERE / domain / f"{task['id']}.json", task)
            experts[task["id"]] = expert
            for name, data in files.items():
                out = HERE / "files" / task["id"] / name
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(data)
    for split, index in splits.items():
        _dump(HERE / f"{split}.json", index)
    _dump(HERE / "experts.json", experts)
    total = sum(len(v) for v in experts.values())
    print(f"wrote {len(experts)} tasks ({total} expert steps) to {HERE}")


if __name__ == "__main__":
    main()
