"""What differs between two runs: their commands and their JSON columns, as rows.

Plain functions (no Streamlit): the Compare page's "What changed" shows their output.
"""

from __future__ import annotations

import difflib
from typing import Any

import pandas as pd

from stepscope.app.formats import fmt_time, fmt_value

#: a Unix time at or after 2001-09-09: a key named ``at``/``*_at`` holding one is a moment
_EPOCH_FLOOR = 1e9

#: keys that name the item of a list of objects (``applied``: one record per fix)
ITEM_NAMES = ("fix", "name", "id")


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested JSON -> {'facts › settings › threads': leaf}: differences become single rows,
    named as a reader says them. A list of plain values is one row (its items joined); a
    list of named objects is one group per name (``applied › dataloader_workers``), never
    ``applied[1].change``; a fix's record is its change in words ("not applied: ..." when it was not)."""
    out: dict[str, Any] = {}
    if isinstance(value, dict):
        if not value and prefix:
            out[prefix] = "none"
        for k, v in value.items():
            out.update(flatten(v, f"{prefix} › {k}" if prefix else str(k)))
    elif isinstance(value, list):
        if all(not isinstance(v, (dict, list)) for v in value):
            out[prefix] = ", ".join(_show(v) for v in value) or "none"
        for i, v in enumerate(value):
            if not isinstance(v, dict):
                if isinstance(v, list):
                    out.update(flatten(v, f"{prefix} › {i + 1}"))
                continue
            name = next((str(v[k]) for k in ITEM_NAMES if k in v), str(i + 1))
            if "change" in v:  # a fix's record (app/applied.py): what it changed
                out[f"{prefix} › {name}"] = v["change"]
            else:
                rest = {k: x for k, x in v.items() if str(x) != name}
                out.update(flatten(rest, f"{prefix} › {name}"))
    else:
        out[prefix] = value
    return out


def json_diff(a: dict[str, Any], b: dict[str, Any]) -> pd.DataFrame:
    """Keys whose values differ between two runs' JSON columns (key, A, B); '—' = absent."""
    fa, fb = flatten(a), flatten(b)
    rows = []
    for key in sorted(set(fa) | set(fb)):
        va, vb = fa.get(key, "—"), fb.get(key, "—")
        if va != vb:
            rows.append({"setting": key, "A": _show(va, key), "B": _show(vb, key)})
    return pd.DataFrame(rows, columns=["setting", "A", "B"])


def _show(value: Any, key: str = "") -> str:
    """A JSON leaf in words: no Python repr (None, True) on the page, and a moment
    (``diagnosed › at``, ``*_at``) as a date and time, not 1795827836.01."""
    last = key.rsplit(" › ", 1)[-1]
    moment = last == "at" or last.endswith("_at")
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if moment and number and value >= _EPOCH_FLOOR:
        return fmt_time(float(value))
    return fmt_value(value)


def command_diff(a: list[str], b: list[str]) -> list[str]:
    """The argv edits that turn A's command into B's, one readable line each."""
    lines = []
    sm = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        old, new = " ".join(a[i1:i2]), " ".join(b[j1:j2])
        if op == "insert":
            lines.append(f"added: {new}")
        elif op == "delete":
            lines.append(f"removed: {old}")
        elif op == "replace":
            lines.append(f"changed: {old} → {new}")
    return lines
