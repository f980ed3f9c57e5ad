"""An operator whose calls per step changed is diffed by its input shapes.

"aten::mm: 7 calls a step, now 8, +0.2 ms (interval -1.1 to +0.4)" hides which call is
new under the noise of the seven that were there before; "aten::mm (160x384, 384x384):
new, 0.35 ms" names the added call and measures it alone, as TraceLens groups its
operators by name and shapes. So the names whose calls per step differ between the two
runs are split by the input shapes the loader kept (``Trace.op_args``, the FLOP
operators); every other name stays one row, so a diff of unchanged code reads as before.
"""

from __future__ import annotations

import numpy as np
import orjson
import pandas as pd

#: Calls per step that count as a change: a call every other step, not a window's edge.
MIN_CALL_CHANGE = 0.5


def shapes(args: bytes | None) -> str:
    """``b'[[[160,384],[384,384]],...]'`` as "160x384, 384x384"; "" where unknown."""
    if not args:
        return ""
    try:
        dims = orjson.loads(args)[0]
    except (orjson.JSONDecodeError, IndexError, KeyError, TypeError):
        return ""
    if not isinstance(dims, list):
        return ""
    return ", ".join("x".join(map(str, d)) for d in dims if isinstance(d, list) and d)


def split_changed(
    calls_a: pd.DataFrame, windows_a: int, calls_b: pd.DataFrame, windows_b: int
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Both sides' calls (``op_steps.op_calls`` with ``args``), the operators whose calls
    per step changed renamed "name (shapes)" where their shapes are known."""
    if "args" not in calls_a or "args" not in calls_b:
        return calls_a, calls_b
    ops_a, ops_b = calls_a["kind"] == "operator", calls_b["kind"] == "operator"
    per_a = calls_a.loc[ops_a, "name"].value_counts() / max(windows_a, 1)
    per_b = calls_b.loc[ops_b, "name"].value_counts() / max(windows_b, 1)
    change = per_b.sub(per_a, fill_value=0.0).abs()
    changed = set(change.index[change >= MIN_CALL_CHANGE])
    if not changed:
        return calls_a, calls_b
    return _renamed(calls_a, ops_a, changed), _renamed(calls_b, ops_b, changed)


def _renamed(calls: pd.DataFrame, ops: pd.Series, changed: set[str]) -> pd.DataFrame:
    rows = np.flatnonzero(ops.to_numpy() & calls["name"].isin(changed).to_numpy())
    if not rows.size:
        return calls
    cache: dict[bytes | None, str] = {}
    names, args = calls["name"].to_numpy(), calls["args"].to_numpy()
    labels = []
    for name, arg in zip(names[rows], args[rows], strict=True):
        if arg not in cache:
            cache[arg] = shapes(arg)
        labels.append(f"{name} ({cache[arg]})" if cache[arg] else name)
    out = calls.copy()
    column = out["name"].to_numpy(dtype=object).copy()
    column[rows] = labels
    out["name"] = column
    return out


__all__ = ["MIN_CALL_CHANGE", "shapes", "split_changed"]
