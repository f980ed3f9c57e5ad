"""The output guard of inference experiments: recorded outputs, compared with the baseline's.

Unit tests on hand-made outputs (exact agreement and difference figures), the recorder's
choice of the tensor that stands for an output, the plugin contract that brings a test fix
into the catalog, and one real experiment on a small inference job where a fix that
perturbs the model's outputs fails the guard (and is not kept) while a harmless one passes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from stepscope import fixes as catalog
from stepscope.collectors.launch.launcher import launch_run
from stepscope.collectors.trials.output_record import first_tensor
from stepscope.optim_runner.guards.output_guard import (
    DEFAULT_RECORDED_CALLS,
    check_outputs,
    compare,
    load_outputs,
)
from stepscope.store import RunStore

JOBS = Path(__file__).resolve().parent / "jobs"
REPO = JOBS.parents[1]

LOGITS = torch.tensor([[2.0, 1.0, 0.0], [0.0, 1.0, 2.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])


# -- comparing hand-made outputs -------------------------------------------------------------
def test_classifier_outputs_are_judged_by_top1_agreement() -> None:
    flipped = LOGITS.clone()
    flipped[2] = torch.tensor([0.0, 3.0, 0.0])  # one row of four chooses another class
    diff = compare([LOGITS], [flipped])
    assert diff.classifier and diff.rows == 4 and diff.agreement == 0.75
    assert diff.max_abs == 3.0 and diff.max_rel == pytest.approx(1.5)
    failed = check_outputs([[LOGITS]], [[flipped]])
    assert failed.ok is False and failed.agreement == 0.75
    assert failed.tolerance == pytest.approx(0.01) and "75 %" in failed.reason
    assert check_outputs([[LOGITS]], [[flipped]], min_agreement=0.7).ok is True
    # small moves that keep every arg-max keep the outputs, whatever their size
    assert check_outputs([[LOGITS]], [[LOGITS + 0.3 * torch.eye(3)[[0, 2, 0, 2]]]]).ok is True


def test_regression_outputs_are_judged_by_their_largest_difference() -> None:
    base = torch.tensor([[1.0], [2.0], [-4.0]])
    cand = base + torch.tensor([[0.0], [0.02], [0.0]])
    diff = compare([base], [cand])
    assert not diff.classifier and diff.agreement is None
    assert diff.max_abs == pytest.approx(0.02) and diff.max_rel == pytest.approx(0.005)
    kept = check_outputs([[base]], [[cand]])
    assert kept.ok is True and kept.measure == "max_rel_diff"
    assert kept.drift == pytest.approx(0.005) and kept.tolerance == pytest.approx(0.01)
    assert check_outputs([[base]], [[cand]], tolerance=1e-3).ok is False


def test_the_baseline_trials_own_differences_are_the_noise_floor() -> None:
    base = torch.tensor([[1.0], [2.0], [-4.0]])
    other = base + torch.tensor([[0.0], [0.0], [0.04]])  # 1 % of the scale between trials
    cand = base + torch.tensor([[0.08], [0.0], [0.0]])  # 2 %: beyond 1 %, within 3 x noise
    check = check_outputs([[base], [other]], [[cand]])
    assert check.baseline_drift == pytest.approx(0.01)
    assert check.tolerance == pytest.approx(0.03) and check.ok is True


def test_a_larger_batch_is_compared_row_by_row() -> None:
    rows = torch.randn(8, 5)
    base_calls = list(rows.split(2))  # four calls of 2
    cand_calls = list(rows[:6].split(4))  # calls of 4 and 2: fewer rows in all
    diff = compare(base_calls, cand_calls)
    assert diff.rows == 6 and diff.agreement == 1.0 and diff.max_abs == 0.0


def test_token_logits_agree_per_token_and_images_are_regression_outputs() -> None:
    tokens = torch.zeros(2, 3, 5)  # (batch, tokens, vocabulary)
    tokens[..., 1] = 1.0
    moved = tokens.clone()
    moved[1, 2, 4] = 2.0  # one token of six chooses another word
    diff = compare([tokens], [moved])
    assert diff.classifier and diff.rows == 6 and diff.agreement == pytest.approx(5 / 6)
    image = torch.ones(2, 3, 4, 4)
    brighter = image.clone()
    brighter[0, 0, 0, 0] = 1.005
    diff = compare([image], [brighter])
    assert not diff.classifier and diff.rows == 2 and diff.max_rel == pytest.approx(0.005)


def test_non_finite_outputs_and_a_changed_shape_fail() -> None:
    nan = LOGITS.clone()
    nan[1, 1] = float("nan")
    assert "NaN" in check_outputs([[LOGITS]], [[nan]]).reason
    assert check_outputs([[LOGITS]], [[nan]]).ok is False
    wider = check_outputs([[LOGITS]], [[torch.zeros(4, 4)]])
    assert wider.ok is False and "shape changed" in wider.reason
    assert check_outputs([[]], [[LOGITS]]).ok is None  # nothing recorded: not checked
    assert check_outputs([[LOGITS]], [[]]).ok is False


def test_the_tensor_that_stands_for_an_output() -> None:
    t = torch.ones(2, 3)
    assert first_tensor(t, torch) is t
    assert first_tensor((None, t, torch.zeros(1)), torch) is t
    assert first_tensor({"loss": torch.zeros(()), "logits": t}, torch) is t
    assert first_tensor(OrderedDict(hidden=t), torch) is t
    assert first_tensor("text", torch) is None


# -- fixes from outside the catalog ----------------------------------------------------------
def test_a_fix_module_named_in_the_environment_joins_the_catalog(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(JOBS))
    monkeypatch.setattr(catalog, "FIXES", dict(catalog.FIXES))
    monkeypatch.setattr(catalog, "PLUGIN_ERRORS", [])
    added = catalog.load_plugins("perturb_outputs_fix, no_such_fix_module")
    assert added == ["perturb_outputs"]
    assert catalog.get("perturb_outputs").changes_numerics
    assert list(catalog.FIXES)[-1] == "perturb_outputs"  # after the catalog's own
    assert len(catalog.PLUGIN_ERRORS) == 1 and "no_such_fix_module" in catalog.PLUGIN_ERRORS[0]
    assert catalog.load_plugins("tests.jobs.perturb_outputs_fix") == []  # the id is taken
    assert "taken" in catalog.PLUGIN_ERRORS[-1]


# -- a real experiment on an inference job ---------------------------------------------------
@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    home = tmp_path_factory.mktemp("guard") / "home"
    job = [sys.executable, str(JOBS / "infer_loader.py"), "--calls", "30"]
    run_id, code = launch_run(job, home=home, max_steps=10, quiet=True)
    assert code == 0
    env = dict(os.environ)
    env.update(
        STEPSCOPE_HOME=str(home),
        STEPSCOPE_FIX_MODULES="perturb_outputs_fix",  # reaches the trial jobs too
        PYTHONPATH=os.pathsep.join(p for p in (str(JOBS), env.get("PYTHONPATH")) if p),
    )
    out = subprocess.run(
        [
            *(sys.executable, "-m", "stepscope.app.cli", "--home", str(home)),
            *("optimize", str(run_id), "--fixes", "perturb_outputs,cpu_threads"),
            *("--steps", "8", "--trials", "2", "--allow-numerics", "--json"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return {"home": home, "run_id": run_id, "result": json.loads(out.stdout)}


def test_a_candidate_that_perturbs_the_outputs_fails_the_guard_and_is_not_kept(guarded) -> None:
    result = guarded["result"]
    assert result["guard"] == "outputs"
    by_name = {c["name"]: c for c in result["candidates"]}
    for name in ("perturb_outputs", "all"):
        cand = by_name[name]
        assert cand["status"] == "completed" and cand["quality_ok"] is False
        assert cand["quality"]["measure"] == "top1_agreement"
        assert cand["quality"]["agreement"] < 0.9
        assert cand["quality"]["reason"].startswith("outputs changed")
    harmless = by_name["cpu_threads"]
    assert harmless["quality_ok"] is True and harmless["quality"]["agreement"] == 1.0
    fixes = {f["id"]: f for f in result["fixes"]}
    assert fixes["perturb_outputs"]["kept"] is False
    assert "perturb_outputs" not in result["best"]["fixes"]


def test_every_trial_recorded_the_models_first_outputs(guarded) -> None:
    with RunStore(guarded["home"]) as store:
        trials = [r for r in store.runs()["id"] if int(r) != guarded["run_id"]]
        result = guarded["result"]
        listed = [r for arm in (result["baseline"], *result["candidates"]) for r in arm["runs"]]
        # 4 arms x 2 trials at most: the adaptive design stops a decided arm after one
        assert sorted(map(int, trials)) == sorted(listed) and 4 <= len(trials) <= 8
        for run_id in trials:
            outputs = load_outputs(store, int(run_id))
            assert outputs is not None and 1 <= len(outputs) <= DEFAULT_RECORDED_CALLS
            assert all(o.shape == (8, 10) for o in outputs)  # batch 8, 10 classes
        # the user's own run was not asked to record anything
        assert load_outputs(store, guarded["run_id"]) is None
        plan = json.loads((store.run_dir(int(trials[0])) / "plan.json").read_text())
    assert plan["record_outputs"] == DEFAULT_RECORDED_CALLS


def test_baseline_trials_on_the_same_seed_record_identical_outputs(guarded) -> None:
    with RunStore(guarded["home"]) as store:
        base = guarded["result"]["baseline"]["runs"]
        first, second = (load_outputs(store, r) for r in base)
    assert first is not None and second is not None
    n = min(len(first), len(second))
    assert all(np.array_equal(a, b) for a, b in zip(first[:n], second[:n], strict=True))


def test_the_optimize_page_shows_the_outputs_changed(guarded, monkeypatch) -> None:
    from streamlit.testing.v1 import AppTest  # local: only this test opens the page

    monkeypatch.setenv("STEPSCOPE_HOME", str(guarded["home"]))
    at = AppTest.from_file(str(REPO / "stepscope" / "app" / "dashboard" / "main.py"))
    at.run(timeout=120)
    at.query_params.update(experiment=str(guarded["result"]["experiment_id"]))
    at.switch_page("views/optimize/page.py").run(timeout=120)
    assert not at.exception, [e.value for e in at.exception]
    table = next(df.value for df in at.dataframe if "outputs" in df.value.columns)
    rows = {r["candidate"]: r for r in table.to_dict("records")}
    assert rows["perturb_outputs"]["outputs"] == "changed"
    assert "top-1 agreement" in rows["perturb_outputs"]["why"]
    assert rows["cpu_threads"]["outputs"] == "same"
