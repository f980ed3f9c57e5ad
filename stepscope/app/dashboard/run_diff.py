"""What differs between two runs: their commands and their JSON columns, as rows.

Plain functions (no Streamlit): the Compare page's "What changed" shows their output.
"""

from __future__ import annotations

import difflib
from typing import Any

import pandas as pd


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested JSON -> {'a.b[0].c': leaf}: differences become single rows."""
    out: dict[str, Any] = {}
    if isinstance(value, dict):
        if not value and prefix:
            out[prefix] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(value, list):
        if not value and prefix:
            out[prefix] = []
        for i, v in enumerate(value):
            out.update(flatten(v, f"{prefix}[{i}]"))
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
            rows.append({"setting": key, "A": _show(va), "B": _show(vb)})
    return pd.DataFrame(rows, columns=["setting", "A", "B"])


def _show(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)


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
