"""``ExperimentOptions``: one declaration, the same options on every path (CLI, the
background process's request file, the dashboard's ``start_experiment``). That a real
background experiment gets every option (``stall_s``, ``busy_repeats``) is asserted in
``test_experiment.py``, on a real run."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from stepscope.optim_runner import background
from stepscope.optim_runner.experiment.options import ExperimentOptions, form_fields, form_input
from stepscope.optim_runner.guards.output_guard import DEFAULT_MIN_AGREEMENT


def test_cli_arguments_build_the_options() -> None:
    parser = argparse.ArgumentParser()
    ExperimentOptions.add_arguments(parser)
    args = parser.parse_args(["--fixes", "a, b,", "--stall", "90", "--budget", "5", "--full"])
    assert ExperimentOptions.from_args(args) == ExperimentOptions(
        fixes=("a", "b"), stall_s=90.0, budget_min=5.0, full=True
    )
    assert ExperimentOptions.from_args(parser.parse_args([])) == ExperimentOptions()


def test_json_round_trip_and_unknown_keys_refused() -> None:
    options = ExperimentOptions(fixes=("a",), stall_s=90.0, busy_repeats=0, draft_model="d")
    assert ExperimentOptions.from_json(json.loads(json.dumps(options.to_json()))) == options
    with pytest.raises(ValueError, match="unknown experiment option.*stal"):
        ExperimentOptions.from_json({"steps": 3, "stal": 5})


def test_form_fields_are_options() -> None:
    assert set(form_fields()) <= set(ExperimentOptions().to_json())
    assert "fixes" in form_fields() and "budget_min" not in form_fields()


def test_the_form_shows_the_declared_defaults_within_its_bounds() -> None:
    """The dashboard's widgets (``option_inputs.py``) read label, help, default and
    bounds from the declaration: a default the form could not show would be refused."""
    defaults = ExperimentOptions()
    for name in form_fields():
        shown = form_input(name)
        assert shown.label and shown.help, name
        if shown.min_value is not None:
            assert shown.min_value <= shown.default <= shown.max_value, name
    assert (form_input("steps").default, form_input("trials").default) == (
        defaults.steps,
        defaults.trials,
    )
    assert form_input("keep_explicit").default is False
    # None in the options means the guard's default: the form shows that number
    assert defaults.min_agreement is None
    assert form_input("min_agreement").default == DEFAULT_MIN_AGREEMENT
    with pytest.raises(KeyError, match="budget_min"):
        form_input("budget_min")


def test_background_refuses_an_unknown_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    (home / "experiments").mkdir(parents=True)
    request = {"baseline_run_id": 1, "config": {"steps": 3, "stal": 5}}
    (home / "experiments" / "7.json").write_text(json.dumps(request))
    assert background.main(["--home", str(home), "--experiment", "7"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown experiment option" in err[0] and "stal" in err[0]
