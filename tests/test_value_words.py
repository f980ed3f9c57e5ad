"""Figures read as words a user reads: counts with their thousands grouped where settings
are listed, sizes without exponents (issue 39)."""

from __future__ import annotations

from stepscope.app.dashboard.views.compare.run_diff import json_diff
from stepscope.app.formats import fmt_value


def test_parameter_counts_have_thousands_separators() -> None:
    # "What changed" listed GPT-2's 124439808 parameters as one run of digits
    a = {"model": {"class": "GPT2LMHeadModel", "parameters": 124439808, "layers": 12}}
    b = {"model": {"class": "GPT2LMHeadModel", "parameters": 354823168, "layers": 24}}
    rows = json_diff(a, b).set_index("setting")
    assert rows.loc["model › parameters", "A"] == "124,439,808"
    assert rows.loc["model › parameters", "B"] == "354,823,168"
    assert rows.loc["model › layers", "B"] == "24"  # small numbers as they are
    assert fmt_value(4) == "4" and fmt_value(True) == "yes" and fmt_value(0.5) == "0.5"


def test_a_peak_just_under_a_gib_reads_in_mib_not_in_exponents() -> None:
    # the Run page's tile read "1.01e+…" for a hogwild job's 1,012 MiB peak
    from stepscope.app.formats import fmt_bytes

    assert fmt_bytes(1012 * 2**20, digits=3) == "1012 MiB"
    assert fmt_bytes(999.4 * 2**20, digits=3) == "999 MiB"
    assert fmt_bytes(1.5 * 2**30, digits=3) == "1.5 GiB"
    assert fmt_bytes(1012 * 2**20) == "1012.0 MiB"


def test_a_step_chart_of_long_steps_reads_in_seconds_not_thousands_of_ms() -> None:
    # an LBFGS job's 58 s steps read "80k" on an axis in ms (issue 39)
    import pandas as pd

    from stepscope.app.dashboard.charts.steps import step_time_chart

    steps = pd.DataFrame(
        {"rank": 0, "worker": 0, "step": range(4), "kind": "optimizer", "profiled": 0,
         "start_s": [58.0 * i for i in range(4)], "end_s": [58.0 * (i + 1) for i in range(4)]}
    )  # fmt: skip
    fig = step_time_chart(steps, 1, 58.0)
    assert fig.layout.yaxis.title.text == "step time (s)"
    assert max(max(t.y) for t in fig.data) == 58.0
