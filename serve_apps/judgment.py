"""Parse the analyzer's answers and combine k votes into d and v (METHOD.md §2). Pure Python.

Never raises on model output: whatever the text, the result is a :class:`Judgment`, with
``d = 0`` and a ``status``/``reason`` when the step's self-distillation must be masked.

Parsing is strict and gives the reference analyzer's verdicts (ComputerSD
``online-rl/reward/analyzer_agent.py``): the answer is the FIRST JSON object, decoded from any
``{`` of the text (prose, code fences and nesting around it are skipped), that has all four
keys ``consistency``, ``effectiveness``, ``guide``, ``avoid``. Its verdicts must be 0 or 1 (a
JSON number 0/1, a boolean, or the string "0"/"1"), its guide and avoid strings (stripped).
Anything else is a format error: an invalid vote, never salvaged. As in the reference, a
``<think>`` block is not skipped: the answer object is expected after it, and a reasoning trace
that drafts one with all four keys is taken at its word.

Votes (the reference's majority rule): each field's value is the majority of the VALID votes
(a tie, or no valid vote, leaves it missing). The guide/avoid come from one representative
vote: among valid votes with some guidance, the one agreeing with more majority fields, then
the longest guidance, then the first. ``d = +1`` iff consistency = 1 and effectiveness = 1,
``d = -1`` otherwise; ``d = 0`` (masked) when a field is missing or no valid vote gives
guidance. ``v = (consistency + effectiveness) / 2``, or 0.5 (neutral) when either is missing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from serve_apps.prompting.messages import guidance_text

MAX_SCAN_CHARS = 65536
"""Longest answer prefix searched (the reference allows 4096 tokens, ~16k characters)."""
MAX_TEXT_FIELD = 2000
"""Guide/avoid are cut here: they go into the privileged context of every rescoring."""
ANSWER_FIELDS = ("consistency", "effectiveness", "guide", "avoid")
_VERDICTS = ("consistency", "effectiveness")
_DECODER = json.JSONDecoder()
_OBJECT_START = re.compile(r'\{\s*"')
MAX_CANDIDATES = 1024
"""Most ``{"`` positions tried; answers with more before the real object are format errors."""

Status = Literal["ok", "format_error", "empty_guidance", "no_majority"]


class Vote(BaseModel):
    """One parsed analyzer answer; ``errors`` empty = a valid vote."""

    consistency: int | None = None
    effectiveness: int | None = None
    guide: str = ""
    avoid: str = ""
    errors: list[str] = Field(default_factory=list)

    @property
    def valid(self) -> bool:
        return not self.errors


class Judgment(BaseModel):
    """The combined judgment of k votes, as stored with a step sample."""

    consistency: int | None
    effectiveness: int | None
    guide: str
    avoid: str
    guidance: str = Field(description="[GUIDE]/[AVOID] text for the privileged context.")
    d: int = Field(description="+1 good step, -1 bad step, 0 self-distillation masked.")
    v: float = Field(description="(consistency + effectiveness) / 2; 0.5 when one is missing.")
    status: Status = Field(description="ok, or why the step is masked (d = 0).")
    reason: str | None = Field(None, description="Why d = 0, or vote errors; None when clean.")
    votes: list[Vote]
    raw: list[str] = Field(description="The analyzer's raw answers, one per vote.")


class _FormatError(ValueError):
    pass


def parse_vote(text: Any) -> Vote:
    """Parse one answer strictly; never raises (a format error is an invalid vote)."""
    if not isinstance(text, str):
        return Vote(errors=[f"answer is {type(text).__name__}, not text"])
    obj = _first_answer_object(text[:MAX_SCAN_CHARS])
    if obj is None:
        return Vote(errors=["no JSON object with consistency, effectiveness, guide and avoid"])
    try:
        return Vote(
            consistency=_verdict(obj, "consistency"),
            effectiveness=_verdict(obj, "effectiveness"),
            guide=_guidance_field(obj, "guide"),
            avoid=_guidance_field(obj, "avoid"),
        )
    except _FormatError as exc:
        return Vote(errors=[str(exc)])


def combine_votes(raw: Sequence[Any]) -> Judgment:
    """Parse k answers, take each verdict's majority of the valid votes; never raises."""
    votes = [parse_vote(r) for r in raw]
    valid = [v for v in votes if v.valid]
    c = _majority([v.consistency for v in valid])
    e = _majority([v.effectiveness for v in valid])
    rep = _representative(valid, c, e)
    status = _status(valid, rep, c, e)
    d = 0 if status != "ok" else (1 if c == 1 and e == 1 else -1)
    guide, avoid = (rep.guide, rep.avoid) if rep is not None else ("", "")
    return Judgment(
        consistency=c,
        effectiveness=e,
        guide=guide,
        avoid=avoid,
        guidance=guidance_text(guide, avoid),
        d=d,
        v=(c + e) / 2 if c is not None and e is not None else 0.5,
        status=status,
        reason=_reason(status, votes, valid, c, e),
        votes=votes,
        raw=[r if isinstance(r, str) else repr(r) for r in raw],
    )


def _first_answer_object(text: str) -> dict[str, Any] | None:
    """The first object decoded at some ``{`` that has every answer field, else None.

    Only a ``{`` followed by a key can start such an object, so other braces are not tried;
    the number of tries is capped because each failed decode costs O(len(text))."""
    for n, match in enumerate(_OBJECT_START.finditer(text)):
        if n >= MAX_CANDIDATES:
            break
        try:
            obj, _ = _DECODER.raw_decode(text, match.start())
        except (ValueError, RecursionError):
            continue
        if isinstance(obj, dict) and all(f in obj for f in ANSWER_FIELDS):
            return obj
    return None


def _verdict(obj: dict[str, Any], name: str) -> int:
    value = obj[name]
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float) and value in (0, 1):
        return int(value)
    if isinstance(value, str) and value.strip() in ("0", "1"):
        return int(value.strip())
    raise _FormatError(f"{name}={_short(value)} is not 0 or 1")


def _guidance_field(obj: dict[str, Any], name: str) -> str:
    value = obj[name]
    if not isinstance(value, str):
        raise _FormatError(f"{name}={_short(value)} is not a string")
    return value.strip()[:MAX_TEXT_FIELD]


def _majority(values: list[int | None]) -> int | None:
    ones, zeros = values.count(1), values.count(0)
    return None if ones == zeros else int(ones > zeros)


def _representative(valid: list[Vote], c: int | None, e: int | None) -> Vote | None:
    """The valid vote with guidance that agrees with more majorities, then the longest one."""
    guided = [v for v in valid if v.guide or v.avoid]
    if not guided:
        return None

    def rank(v: Vote) -> tuple[int, int]:
        agrees = (v.consistency == c) + (v.effectiveness == e)  # a missing majority never agrees
        return agrees, len(_reference_guidance(v.guide, v.avoid))

    return max(guided, key=rank)  # the first of equals, as the reference


def _reference_guidance(guide: str, avoid: str) -> str:
    """The reference's guidance text (an empty block left out); only its length is used."""
    blocks = [f"[{tag}]\n{text}" for tag, text in (("GUIDE", guide), ("AVOID", avoid)) if text]
    return "\n\n".join(blocks)


def _status(valid: list[Vote], rep: Vote | None, c: int | None, e: int | None) -> Status:
    if not valid:
        return "format_error"
    if rep is None:
        return "empty_guidance"
    return "ok" if c is not None and e is not None else "no_majority"


def _reason(
    status: Status, votes: list[Vote], valid: list[Vote], c: int | None, e: int | None
) -> str | None:
    reasons = {
        "ok": [],
        "format_error": [f"no valid vote of {len(votes)}"],
        "empty_guidance": ["no valid vote gives a guide or an avoid"],
        "no_majority": [
            f"{name}: no majority of the {len(valid)} valid votes"
            for name, value in (("consistency", c), ("effectiveness", e))
            if value is None
        ],
    }[status]
    reasons += [f"vote {i}: {err}" for i, vote in enumerate(votes) for err in vote.errors]
    return "; ".join(reasons) or None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"
