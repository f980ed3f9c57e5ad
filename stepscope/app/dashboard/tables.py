"""Tables as the page shows them: each figure through its unit's formatter, a dash for
an unknown one.

Streamlit draws a missing cell as the word "None" and a float with all its digits
("42.1433"), and no setting changes that, so a column that can hold an unknown figure
is handed over as text made by ``app.formats``: the same "8.1 ms" or "84.3 %" as the
headline and the CLI. What is lost is numeric sorting on those columns, a fair price for
a table that says one thing (``unknown_in_words`` keeps a column numeric while every
figure in it is known).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pandas as pd

from stepscope.app.formats import fmt_num, fmt_pct, fmt_s, missing

DASH = "—"


def fmt_sig(x: Any) -> str:
    """Three significant figures (thousands grouped): rates, intensities, counts."""
    return DASH if missing(x) else fmt_num(float(x))


def fmt_share(x: Any) -> str:
    return fmt_pct(None if missing(x) else float(x))


def fmt_seconds(x: Any) -> str:
    return fmt_s(None if missing(x) else float(x))


def fmt_one_decimal(x: Any) -> str:
    """A figure whose unit is in its column's header ("ms", "%"): as its number format."""
    return DASH if missing(x) else f"{float(x):.1f}"


def fmt_text(x: Any) -> str:
    return DASH if missing(x) or x == "" else str(x)


def fmt_int(x: Any) -> str:
    return DASH if missing(x) else f"{int(x):,}"


def in_words(frame: pd.DataFrame, formats: Mapping[str, Callable[[Any], str]]) -> pd.DataFrame:
    """``frame`` with each column named in ``formats`` turned into its text; the other
    columns (already text, or never unknown) as they are."""
    out = frame.copy()
    for column, fmt in formats.items():
        if column in out:
            out[column] = [fmt(v) for v in out[column].tolist()]
    return out


def unknown_in_words(
    frame: pd.DataFrame, formats: Mapping[str, Callable[[Any], str]]
) -> pd.DataFrame:
    """``in_words`` only for the columns that hold an unknown figure: where every figure
    is known the column stays numeric (sortable, formatted by its column config)."""
    unknown = {c: f for c, f in formats.items() if c in frame and frame[c].isna().any()}
    return in_words(frame, unknown)
