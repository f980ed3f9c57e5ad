"""No histogram drawn from a handful of points (issue 39): a line says there are too few."""

from __future__ import annotations

from pathlib import Path

import pytest
from dashboard_helpers import no_errors, open_page, stepscope, texts

from stepscope.store import RunStore

TOO_FEW = "too few timed steps for a histogram"


def _infer(home: Path, name: str, calls: int) -> int:
    stepscope(
        home, "run", "--name", name, "--no-profile", "--", "python", "tests/jobs/infer.py",
        "--calls", str(calls),
    )  # fmt: skip
    with RunStore(home) as store:
        return store.resolve_run(name)


def test_a_latency_histogram_of_few_requests_is_a_line_instead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "h"
    few = _infer(home, "few", 4)
    many = _infer(home, "many", 20)
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    at = open_page("run", run=str(few))
    no_errors(at)
    assert "Latency" in texts(at)  # the section is there, its histogram is not
    assert TOO_FEW in texts(at)
    at = open_page("run", run=str(many))
    no_errors(at)
    assert "Latency" in texts(at) and TOO_FEW not in texts(at)
