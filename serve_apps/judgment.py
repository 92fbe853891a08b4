"""Parse the analyzer's answers and combine k votes into d and v (METHOD.md §2). Pure Python.

Never raises on model output: whatever the text, the result is a :class:`Judgment`, with
``d = 0`` and a ``reason`` when a field is missing, unparseable or tied.

Parsing: drop a ``<think>…</think>`` block; find every balanced ``{…}`` object in the text
(code fences and prose around it are ignored); parse each with ``json`` (then, leniently, as a
Python literal: single quotes, True/False); use the LAST object that has a consistency or
effectiveness key. If none parses, a per-field regex salvages ``"consistency": 1`` style
pairs. Values 0/1, true/false, "0"/"1", "yes"/"no" are accepted; anything else is invalid.
The same key twice in one object with different values is ambiguous, hence invalid.

Votes: a field's value is the one given by a strict majority of ALL k votes (more than k/2);
otherwise (tie, too many invalid votes) it is missing. ``d = +1`` iff consistency = 1 and
effectiveness = 1, ``d = -1`` when both are present otherwise, ``d = 0`` when either is
missing. ``v = (consistency + effectiveness) / 2``, or 0.5 (neutral) when either is missing.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

from serve_apps.prompting.messages import guidance_text

MAX_SCAN_CHARS = 65536
MAX_OBJECTS = 64
MAX_TEXT_FIELD = 2000
_FIELDS = ("consistency", "effectiveness")
_TRUE = {"1", "true", "yes"}
_FALSE = {"0", "false", "no"}


class Vote(BaseModel):
    """One parsed analyzer answer."""

    consistency: int | None = None
    effectiveness: int | None = None
    guide: str = ""
    avoid: str = ""
    errors: list[str] = Field(default_factory=list)


class Judgment(BaseModel):
    """The combined judgment of k votes, as stored with a step sample."""

    consistency: int | None
    effectiveness: int | None
    guide: str
    avoid: str
    guidance: str = Field(description="[GUIDE]/[AVOID] text for the privileged context.")
    d: int = Field(description="+1 good step, -1 bad step, 0 self-distillation masked.")
    v: float = Field(description="(consistency + effectiveness) / 2; 0.5 when masked.")
    reason: str | None = Field(None, description="Why d = 0, or parse notes; None when clean.")
    votes: list[Vote]
    raw: list[str] = Field(description="The analyzer's raw answers, one per vote.")


def parse_vote(text: Any) -> Vote:
    """Parse one answer; never raises."""
    if not isinstance(text, str):
        return Vote(errors=[f"answer is {type(text).__name__}, not text"])
    body = _strip_thinking(text)[:MAX_SCAN_CHARS]
    obj, notes = _last_judgment_object(body)
    if obj is None:
        return _salvage(body, notes)
    return _vote_from_object(obj, notes)


def combine_votes(raw: Sequence[Any]) -> Judgment:
    """Parse k answers and take the per-field strict majority; never raises."""
    votes = [parse_vote(r) for r in raw]
    reasons: list[str] = []
    values = {f: _majority(f, [getattr(v, f) for v in votes], reasons) for f in _FIELDS}
    c, e = values["consistency"], values["effectiveness"]
    guide, avoid = _pick_texts(votes, c, e)
    if c is None or e is None:
        d, v = 0, 0.5
    else:
        d, v = (1 if c == 1 and e == 1 else -1), (c + e) / 2
    for i, vote in enumerate(votes):
        reasons += [f"vote {i}: {err}" for err in vote.errors]
    return Judgment(
        consistency=c,
        effectiveness=e,
        guide=guide,
        avoid=avoid,
        guidance=guidance_text(guide, avoid),
        d=d,
        v=v,
        reason="; ".join(reasons) or None,
        votes=votes,
        raw=[r if isinstance(r, str) else repr(r) for r in raw],
    )


def _majority(field: str, values: list[int | None], reasons: list[str]) -> int | None:
    k = len(values)
    if k == 0:
        reasons.append(f"{field}: no votes")
        return None
    ones, zeros = values.count(1), values.count(0)
    if ones * 2 > k:
        return 1
    if zeros * 2 > k:
        return 0
    missing = k - ones - zeros
    if missing == k:
        reasons.append(f"{field}: missing or invalid in every vote")
    else:
        reasons.append(f"{field}: no majority ({ones}x1, {zeros}x0, {missing} invalid of {k})")
    return None


def _pick_texts(votes: list[Vote], c: int | None, e: int | None) -> tuple[str, str]:
    """Guide/avoid of the first vote agreeing with the outcome, else the first non-empty."""
    agreeing = [v for v in votes if v.consistency == c and v.effectiveness == e]
    for pool in (agreeing, votes):
        for vote in pool:
            if vote.guide or vote.avoid:
                return vote.guide, vote.avoid
    return "", ""


def _strip_thinking(text: str) -> str:
    end = text.rfind("</think>")
    return text[end + len("</think>") :] if end >= 0 else text


def _last_judgment_object(text: str) -> tuple[dict[str, Any] | None, list[str]]:
    notes: list[str] = []
    found: dict[str, Any] | None = None
    for chunk in _balanced_objects(text):
        obj = _with_fields(_load_object(chunk))
        if obj is not None:
            found = obj
    if found is None:
        notes.append("no JSON object with consistency/effectiveness found")
    return found, notes


def _with_fields(obj: Any, depth: int = 0) -> dict[str, Any] | None:
    """``obj`` if it has a judgment key, else the first nested object that has one."""
    if not isinstance(obj, dict) or depth > 3:
        return None
    if {_norm_key(k) for k in obj} & set(_FIELDS):
        return obj
    for value in obj.values():
        inner = _with_fields(value, depth + 1)
        if inner is not None:
            return inner
    return None


def _balanced_objects(text: str) -> list[str]:
    """Outermost ``{...}`` spans with balanced braces, outside string literals (iterative)."""
    spans: list[str] = []
    depth, start, in_str, esc, quote = 0, -1, False, False, ""
    for i, ch in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == quote:
                in_str = False
        elif ch in "\"'" and depth > 0:
            in_str, quote = True, ch
        elif ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                spans.append(text[start : i + 1])
                if len(spans) >= MAX_OBJECTS:
                    break
    return spans


class _Duplicate(dict):
    """A JSON object that had the same key more than once with different values."""


def _pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    dup: set[str] = set()
    for key, value in pairs:
        if key in out and out[key] != value:
            dup.add(key)
        out[key] = value
    if dup:
        marked = _Duplicate(out)
        marked["__duplicates__"] = sorted(dup)
        return marked
    return out


def _load_object(chunk: str) -> dict[str, Any] | None:
    try:
        obj = json.loads(chunk, object_pairs_hook=_pairs_hook)
    except (ValueError, RecursionError):
        obj = _literal(chunk)
    return obj if isinstance(obj, dict) else None


def _literal(chunk: str) -> Any:
    """Lenient fallback: Python-literal syntax (single quotes, True/False/None)."""
    if len(chunk) > 8192:
        return None
    fixed = re.sub(r"\btrue\b", "True", chunk)
    fixed = re.sub(r"\bfalse\b", "False", fixed)
    fixed = re.sub(r"\bnull\b", "None", fixed)
    try:
        return ast.literal_eval(fixed)
    except (ValueError, SyntaxError, RecursionError, MemoryError, TypeError):
        return None


def _norm_key(key: Any) -> str:
    return str(key).strip().lower()


def _vote_from_object(obj: dict[str, Any], notes: list[str]) -> Vote:
    errors = list(notes)
    dups = {_norm_key(k) for k in obj.get("__duplicates__", [])}
    fields = {_norm_key(k): v for k, v in obj.items() if k != "__duplicates__"}
    values: dict[str, int | None] = {}
    for name in _FIELDS:
        if name in dups:
            errors.append(f"{name} given twice with different values")
        elif name not in fields:
            errors.append(f"{name} missing")
        else:
            values[name] = _binary(name, fields[name], errors)
    return Vote(
        **values, guide=_text(fields.get("guide")), avoid=_text(fields.get("avoid")), errors=errors
    )


def _binary(name: str, value: Any, errors: list[str]) -> int | None:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float) and value in (0, 1):
        return int(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return 1 if value.strip().lower() in _TRUE else 0
    errors.append(f"{name}={_short(value)} is not 0/1")
    return None


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        value = " ".join(str(v) for v in value if isinstance(v, str | int | float))
    if not isinstance(value, str | int | float):
        return ""
    return " ".join(str(value).split())[:MAX_TEXT_FIELD]


_SALVAGE_NUM = r'["\']?{}["\']?\s*[:=]\s*["\']?(true|false|yes|no|[01](?:\.0)?)\b'
_SALVAGE_STR = r'["\']{}["\']\s*:\s*"((?:[^"\\]|\\.)*)"'


def _salvage(text: str, notes: list[str]) -> Vote:
    """Field-by-field regex recovery when no object parses (e.g. truncated JSON)."""
    errors = list(notes)
    found: dict[str, Any] = {}
    for name in _FIELDS:
        hits = {m.lower() for m in re.findall(_SALVAGE_NUM.format(name), text, re.IGNORECASE)}
        values = {1 if h in _TRUE or h.startswith("1") else 0 for h in hits}
        if len(values) == 1:
            found[name] = values.pop()
        elif values:
            errors.append(f"{name}: conflicting values in malformed text")
    for name in ("guide", "avoid"):
        match = re.search(_SALVAGE_STR.format(name), text, re.IGNORECASE)
        if match:
            found[name] = _text(match.group(1).replace('\\"', '"'))
    if any(name in found for name in _FIELDS):
        errors.append("recovered fields from malformed JSON")
    return Vote(**found, errors=errors)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"
