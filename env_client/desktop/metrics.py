"""Evaluator metrics with OSWorld's names and calling convention (``desktop_env/evaluators/
metrics``), written for this project: ``metric(result, expected, **options)`` when the task has
an ``expected`` getter, else ``metric(result, **options)``; each returns a score in [0, 1].
A missing result (a file the agent never saved: None) scores 0.

| metric | result / expected | 1.0 when |
|---|---|---|
| exact_match | value / rules{expected} | equal |
| literal_match | value / value, type?, ignore_case? | equal (strings or lists) |
| is_in_list | value / rules{expected} | rules' expected is an element of value |
| check_include_exclude | text / rules{include, exclude} | every include in it, no exclude |
| fuzzy_match | text / rules{expected} | similarity (difflib ratio; OSWorld uses rapidfuzz) |
| compare_text_file | file / file, ignore_blanks?, ignore_case? | same text |
| diff_text_file | file / file | similarity of the texts (difflib ratio) |
| compare_csv | file / file | same rows |
| compare_table | xlsx / xlsx, rules? | same sheets and cell values (rules: sheet_name, sheet_data) |
| compare_docx_files | docx / docx, ignore_blanks?, ignore_case?, ignore_order? | same paragraph texts |
| compare_line_spacing | docx / docx | same texts and the same line spacing per paragraph |
| is_first_line_centered | docx | first paragraph centred |
| contains_page_break | docx | a page break in the text |
| infeasible | – | (handled by the evaluator: the agent answered FAIL) |
"""

from __future__ import annotations

import csv
import difflib
from collections.abc import Callable
from typing import Any


def _text(value: Any) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)


def exact_match(result: Any, rules: dict[str, Any]) -> float:
    return float(result is not None and result == rules["expected"])


def literal_match(result: Any, expected: Any, **options: Any) -> float:
    if result is None:
        return 0.0
    if options.get("type", "str") == "list":
        if not isinstance(result, list) or not isinstance(expected, list):
            return 0.0
        if options.get("ignore_case"):
            return float([str(r).lower() for r in result] == [str(e).lower() for e in expected])
        return float(result == expected)
    a, b = _text(result), _text(expected)
    return float(a.lower() == b.lower() if options.get("ignore_case") else a == b)


def is_in_list(result: Any, rules: dict[str, Any]) -> float:
    return float(isinstance(result, list) and rules["expected"] in result)


def check_include_exclude(result: Any, rules: dict[str, Any]) -> float:
    if result is None:
        return 0.0
    text = _text(result)
    ok = all(s in text for s in rules.get("include", []))
    return float(ok and not any(s in text for s in rules.get("exclude", [])))


def fuzzy_match(result: Any, rules: dict[str, Any]) -> float:
    if result is None:
        return 0.0
    return difflib.SequenceMatcher(None, _text(result), _text(rules["expected"])).ratio()


def _read(path: str | None) -> str | None:
    if path is None:
        return None
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def compare_text_file(file1: str | None, file2: str | None, **options: Any) -> float:
    a, b = _read(file1), _read(file2)
    if a is None or b is None:
        return 0.0
    if options.get("ignore_blanks"):
        a, b = " ".join(a.split()), " ".join(b.split())
    if options.get("ignore_case"):
        a, b = a.lower(), b.lower()
    return float(a == b)


def diff_text_file(result: str | None, expected: str | None) -> float:
    a, b = _read(result), _read(expected)
    if a is None or b is None:
        return 0.0
    return difflib.SequenceMatcher(None, a, b).ratio()


def compare_csv(result: str | None, expected: str | None, **options: Any) -> float:
    a, b = _read(result), _read(expected)
    if a is None or b is None:
        return 0.0

    def rows(text: str) -> list[list[str]]:
        return [[c.strip() for c in r] for r in csv.reader(text.splitlines()) if any(r)]

    return float(rows(a) == rows(b))


# --- spreadsheets ------------------------------------------------------------------------


def _sheets(path: str) -> dict[str, list[tuple[Any, ...]]]:
    """Sheet name → rows of cell values (cached results of formulas), trailing blanks cut."""
    import openpyxl

    book = openpyxl.load_workbook(path, data_only=True, read_only=True)
    try:
        out = {}
        for ws in book.worksheets:
            rows = [tuple(_cell(v) for v in row) for row in ws.iter_rows(values_only=True)]
            rows = [_rstrip(r) for r in rows]
            while rows and not rows[-1]:
                rows.pop()
            out[ws.title] = rows
        return out
    finally:
        book.close()


def _cell(v: Any) -> Any:
    # A number typed into a cell may come back as int or float; 3 and 3.0 are the same value.
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return "" if v is None else v


def _rstrip(row: tuple[Any, ...]) -> tuple[Any, ...]:
    end = len(row)
    while end and row[end - 1] == "":
        end -= 1
    return row[:end]


def _sheet_ref(sheets: dict[str, list[tuple[Any, ...]]], ref: str) -> list[tuple[Any, ...]]:
    """OSWorld's sheet references: RI<n>/EI<n> by index, RN<name>/EN<name> by name."""
    names = list(sheets)
    if ref[1:2] == "I":
        return sheets[names[int(ref[2:])]]
    return sheets[ref[2:]]


def compare_table(result: str | None, expected: str | None = None, **options: Any) -> float:
    if result is None or expected is None:
        return 0.0
    try:
        got, want = _sheets(result), _sheets(expected)
    except Exception:  # not a readable workbook: the agent saved something else
        return 0.0
    rules = options.get("rules") or [{"type": "sheet_name"}, {"type": "sheet_data"}]
    for rule in rules:
        if rule["type"] == "sheet_name" and list(got) != list(want):
            return 0.0
        if rule["type"] == "sheet_data":
            pairs = [(rule.get("sheet_idx0"), rule.get("sheet_idx1"))]
            if pairs[0][0] is None:
                pairs = [(f"RI{i}", f"EI{i}") for i in range(len(want))]
            for a, b in pairs:
                try:
                    if _sheet_ref(got, a) != _sheet_ref(want, b):
                        return 0.0
                except (KeyError, IndexError, ValueError):
                    return 0.0
    return 1.0


# --- documents ---------------------------------------------------------------------------


def _doc(path: str) -> Any:
    import docx

    return docx.Document(path)


def _paragraph_texts(path: str, **options: Any) -> list[str]:
    texts = [p.text for p in _doc(path).paragraphs]
    if options.get("ignore_blanks", True):
        texts = [" ".join(t.split()) for t in texts]
        texts = [t for t in texts if t]
    if options.get("ignore_case"):
        texts = [t.lower() for t in texts]
    if options.get("ignore_order"):
        texts = sorted(texts)
    return texts


def compare_docx_files(file1: str | None, file2: str | None, **options: Any) -> float:
    if file1 is None or file2 is None:
        return 0.0
    try:
        return float(_paragraph_texts(file1, **options) == _paragraph_texts(file2, **options))
    except Exception:  # not a readable document
        return 0.0


def compare_line_spacing(docx_file1: str | None, docx_file2: str | None) -> float:
    if not compare_docx_files(docx_file1, docx_file2):
        return 0.0
    assert docx_file1 is not None and docx_file2 is not None
    a = [p for p in _doc(docx_file1).paragraphs if p.text.strip()]
    b = [p for p in _doc(docx_file2).paragraphs if p.text.strip()]
    return float(
        all(
            _spacing(p.paragraph_format.line_spacing) == _spacing(q.paragraph_format.line_spacing)
            for p, q in zip(a, b, strict=True)
        )
    )


def _spacing(v: Any) -> float:
    # Unset spacing is single spacing; spacing in points is kept as such (rounded).
    return 1.0 if v is None else round(float(v), 2)


def is_first_line_centered(docx_file: str | None) -> float:
    from docx.enum.text import WD_ALIGN_PARAGRAPH

    if docx_file is None:
        return 0.0
    try:
        paragraphs = [p for p in _doc(docx_file).paragraphs if p.text.strip()]
    except Exception:
        return 0.0
    return float(bool(paragraphs) and paragraphs[0].alignment == WD_ALIGN_PARAGRAPH.CENTER)


def contains_page_break(docx_file: str | None, rules: dict[str, Any] | None = None) -> float:
    """A page break anywhere: a ``w:br type=page`` run or a paragraph's page-break-before."""
    from docx.oxml.ns import qn

    if docx_file is None:
        return 0.0
    try:
        body = _doc(docx_file).element.body
    except Exception:
        return 0.0
    brs = [br for br in body.iter(qn("w:br")) if br.get(qn("w:type")) == "page"]
    before = [
        el for el in body.iter(qn("w:pageBreakBefore")) if el.get(qn("w:val")) not in ("0", "false")
    ]
    return float(bool(brs or before))


def infeasible(*args: Any, **kwargs: Any) -> float:
    """Scored by the evaluator from the last action (FAIL: 1); never called with files."""
    raise RuntimeError("infeasible is decided by the evaluator, not called")


METRICS: dict[str, Callable[..., float]] = {
    f.__name__: f
    for f in (
        exact_match,
        literal_match,
        is_in_list,
        check_include_exclude,
        fuzzy_match,
        compare_text_file,
        diff_text_file,
        compare_csv,
        compare_table,
        compare_docx_files,
        compare_line_spacing,
        is_first_line_centered,
        contains_page_break,
        infeasible,
    )
}
