"""Inference latency and throughput: the percentiles on hand-made steps (exact values), then
on real recorded inference runs: `stepscope show` (text and --json), the Run page, the
Compare page and an experiment's p50/p99 ratios.

The recorded store (one module fixture, about 10 s): ``infer`` is the inference example
(a CNN under inference_mode over a DataLoader, batch sizes known), ``fast`` and ``slow``
the small inference job of tests/jobs (no DataLoader) with a short and a long pause
between requests, ``train`` a training job (no latency block anywhere).
"""

from __future__ import annotations

import base64
import io
import json
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from dashboard_helpers import ENTRY, record, stepscope
from streamlit.testing.v1 import AppTest

from stepscope.analyzers.steps.latency import is_inference, latency_summary
from stepscope.analyzers.steps.step_stats import summarize_steps, timed_steps
from stepscope.app.cli import term
from stepscope.app.cli.optimize import render
from stepscope.app.formats import fmt_num, fmt_s
from stepscope.optim_runner.speedup.latency_compare import latency_ratios
from stepscope.optim_runner.speedup.speed import compare_speed
from stepscope.optim_runner.speedup.stats import speedup_ci, timed_step_times
from stepscope.store import RunStore

MS = 1e-3


def _steps(
    latencies_s: list[float],
    kind: str = "forward",
    rank: int = 0,
    batch: int | None = 4,
    backward_s: float = 0.0,
    profiled: set[int] | None = None,
) -> pd.DataFrame:
    """Back-to-back steps of one rank with the given wall times, forward half of each."""
    ends = np.cumsum(latencies_s) + 1000.0
    starts = np.concatenate([[1000.0], ends[:-1]])
    n = len(latencies_s)
    return pd.DataFrame(
        {
            "rank": rank,
            "step": np.arange(n),
            "start_s": starts,
            "end_s": ends,
            "data_wait_s": 0.0,
            "forward_s": np.asarray(latencies_s) / 2,
            "backward_s": backward_s,
            "optimizer_s": 0.0,
            "batch_size": batch,
            "kind": kind,
            "profiled": [int(i in (profiled or set())) for i in range(n)],
        }
    )


# 11 steps: the default warm-up leaves out the first 2 (10 % rounded up); the 9 timed
# steps take 10, 20, ..., 90 ms
HAND = [1.0, 0.5] + [k * 10 * MS for k in range(1, 10)]


# -- the figures, exactly ----------------------------------------------------------------
def test_percentiles_of_hand_made_steps_are_exact() -> None:
    lat = summarize_steps(_steps(HAND))["latency"]
    assert lat is not None and lat["count"] == 9
    # numpy's linear interpolation over 10..90 ms: rank q/100 * 8 between the sorted steps
    assert lat["p50_s"] == pytest.approx(50 * MS)
    assert lat["p90_s"] == pytest.approx(82 * MS)
    assert lat["p95_s"] == pytest.approx(86 * MS)
    assert lat["p99_s"] == pytest.approx(89.2 * MS)
    assert lat["max_s"] == pytest.approx(90 * MS)
    assert lat["min_s"] == pytest.approx(10 * MS)
    assert lat["mean_s"] == pytest.approx(50 * MS)
    assert lat["requests_per_s"] == pytest.approx(9 / 0.45)  # 9 requests in 450 ms
    assert lat["samples_per_s"] == pytest.approx(36 / 0.45)  # 4 samples each
    assert lat["model"]["p50_s"] == pytest.approx(25 * MS)  # the forward phase: half
    assert lat["model"]["p99_s"] == pytest.approx(44.6 * MS)


def test_profiled_steps_are_left_out_and_ranks_add_up() -> None:
    profiled = _steps(HAND + [5.0], profiled={11})  # a 5 s profiled step: not a request
    assert summarize_steps(profiled)["latency"]["max_s"] == pytest.approx(90 * MS)
    two = pd.concat([_steps(HAND, rank=0), _steps(HAND, rank=1)], ignore_index=True)
    lat = summarize_steps(two)["latency"]
    assert lat["count"] == 18
    assert lat["p50_s"] == pytest.approx(50 * MS)  # pooled
    assert lat["requests_per_s"] == pytest.approx(2 * 9 / 0.45)  # both ranks serve


def test_training_runs_have_no_latency() -> None:
    assert summarize_steps(_steps(HAND, kind="optimizer"))["latency"] is None
    # a job that updates its parameters by hand writes forward steps with a backward
    by_hand = _steps(HAND, backward_s=0.002)
    assert not is_inference(by_hand)
    assert summarize_steps(by_hand)["latency"] is None
    assert summarize_steps(_steps(HAND).iloc[:0])["latency"] is None
    assert latency_summary(timed_steps(_steps(HAND, kind="mark"))) is None


def test_percentile_ratios_with_intervals() -> None:
    base = np.linspace(10, 12, 40) * MS
    ci = speedup_ci(base, base / 2, statistic="p99")
    assert ci.ratio == pytest.approx(2.0)
    assert ci.lo <= ci.ratio <= ci.hi and ci.verdict == "faster"
    # five steps: p99 is the slowest one, and its interval says how little that proves
    few = np.array([10, 20, 30, 40, 100], dtype=float) * MS
    assert speedup_ci(few, few / 2, statistic="p99").verdict == "no measurable change"
    same = speedup_ci([0.01, 0.01], [0.02, 0.02], statistic="p50")
    assert (same.ratio, same.lo, same.hi, same.verdict) == (0.5, 0.5, 0.5, "slower")
    # the Compare page's figures: the p50/p99 of each run's timed steps, A over B
    a, b = _steps(HAND), _steps([x * 2 for x in HAND])
    speed = compare_speed(a, b)
    assert speed.latency is not None and set(speed.latency) == {"p50", "p99"}
    assert speed.latency["p50"].ratio == pytest.approx(0.5)
    assert speed.latency["p99"].ratio == pytest.approx(0.5)
    assert compare_speed(_steps(HAND, kind="optimizer"), b).latency is None


# -- real recorded runs ------------------------------------------------------------------
@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict:
    home = tmp_path_factory.mktemp("latency") / "home"
    ids = {
        "infer": record(
            home,
            "infer",
            "inference_loop.py",
            "--steps",
            "40",
            "--batch-size",
            "8",
            opts=("--max-steps", "16"),
        )
    }
    for name, sleep in (("fast", "0.002"), ("slow", "0.05")):
        stepscope(
            home,
            "run",
            "--name",
            name,
            "--max-steps",
            "14",
            "--",
            sys.executable,
            "tests/jobs/infer.py",
            "--calls",
            "30",
            "--sleep",
            sleep,
        )
    stepscope(home, "run", "--name", "train", "--", sys.executable, "tests/jobs/train.py")
    with RunStore(home) as store:
        for name in ("fast", "slow", "train"):
            ids[name] = store.resolve_run(name)
    return {"home": home, "ids": ids}


def _show_json(home: Path, ref: str) -> dict:
    return json.loads(stepscope(home, "show", ref, "--json").stdout)


def _steps_of(home: Path, run_id: int) -> pd.DataFrame:
    with RunStore(home) as store:
        return store.steps(run_id)


@pytest.mark.slow
def test_show_json_has_the_latency_block(recorded: dict) -> None:
    home = recorded["home"]
    show = _show_json(home, "infer")
    lat = show["latency"]
    assert lat == summarize_steps(_steps_of(home, recorded["ids"]["infer"]))["latency"]
    assert lat["count"] == show["timed_steps"] > 0
    assert 0 < lat["p50_s"] <= lat["p90_s"] <= lat["p95_s"] <= lat["p99_s"] <= lat["max_s"]
    # one rank, every request a step: requests/s is the step rate; batches of 8
    assert lat["requests_per_s"] == pytest.approx(show["steps_per_s"])
    assert lat["samples_per_s"] == pytest.approx(8 * lat["requests_per_s"])
    assert 0 < lat["model"]["p50_s"] <= lat["p50_s"]  # the model call is inside the step
    assert _show_json(home, "train")["latency"] is None


@pytest.mark.slow
def test_show_text_prints_the_percentiles(recorded: dict) -> None:
    home = recorded["home"]
    lat = _show_json(home, "slow")["latency"]
    assert lat["samples_per_s"] is None or lat["samples_per_s"] > 0
    text = stepscope(home, "show", "slow").stdout
    assert f"latency (inference: {lat['count']} timed requests or batches)" in text
    for name in ("p50", "p90", "p95", "p99", "max"):
        row = next(line for line in text.splitlines() if re.match(rf"\W*{name}\s+│", line))
        assert fmt_s(lat[f"{name}_s"]) in row, row
        assert fmt_s(lat["model"][f"{name}_s"]) in row, row
    assert f"requests/s {fmt_num(lat['requests_per_s'])}" in text
    assert "latency (inference" not in stepscope(home, "show", "train").stdout


# -- the dashboard -----------------------------------------------------------------------
@pytest.fixture
def home(recorded: dict, monkeypatch: pytest.MonkeyPatch, _isolated_store: Path) -> Path:
    monkeypatch.setenv("STEPSCOPE_HOME", str(recorded["home"]))
    return recorded["home"]


def _open(page: str, **params: str) -> AppTest:
    at = AppTest.from_file(str(ENTRY), default_timeout=120)
    at.run()
    at.query_params.update(params)
    at.switch_page(f"views/{page}/page.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def _metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def _values(v: object) -> list:
    """A plotly JSON array: a list, or (numpy data) a base64 typed array."""
    if isinstance(v, dict) and "bdata" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]).tolist()
    return list(v)  # type: ignore[call-overload]


def _specs(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


@pytest.mark.slow
def test_run_page_shows_latency_for_inference_only(home: Path, recorded: dict) -> None:
    run_id = recorded["ids"]["infer"]
    at = _open("run", run=str(run_id))
    steps = _steps_of(home, run_id)
    lat = summarize_steps(steps)["latency"]
    m = _metrics(at)
    # the headline leads with p50, p99 and requests/s; the section gives every percentile
    for name in ("p50", "p99"):
        assert m[f"latency {name}"] == fmt_s(lat[f"{name}_s"])
    assert m["requests/s"] == fmt_num(lat["requests_per_s"])
    assert [x.label for x in at.metric][:3] == ["latency p50", "latency p99", "requests/s"]
    said = " · ".join(f"{q} {fmt_s(lat[f'{q}_s'])}" for q in ("p50", "p90", "p95", "p99", "max"))
    assert said in [c.value for c in at.caption], [c.value for c in at.caption]
    specs = _specs(at)
    hist = next(sp for sp in specs if sp["data"][0]["type"] == "histogram")
    assert [t["name"] for t in hist["data"]] == ["iteration", "model call"]
    assert len(_values(hist["data"][0]["x"])) == lat["count"]  # the timed requests only
    assert len(hist["layout"]["shapes"]) == 3  # p50, p95, p99
    notes = {a["text"] for a in hist["layout"]["annotations"]}
    assert {f"{q} {lat[f'{q}_s'] * 1e3:.1f} ms" for q in ("p50", "p95", "p99")} == notes
    over_time = next(
        sp for sp in specs if sp["layout"]["xaxis"]["title"]["text"].startswith("time since")
    )
    timed = next(t for t in over_time["data"] if t["name"] == "timed")
    assert len(_values(timed["customdata"])) == lat["count"]  # one point per timed request
    assert f"Over {lat['count']} timed steps" in " ".join(c.value for c in at.caption)

    at = _open("run", run=str(recorded["ids"]["train"]))
    assert "latency p50" not in _metrics(at)


@pytest.mark.slow
def test_compare_page_gives_p50_and_p99_ratios(home: Path, recorded: dict) -> None:
    a, b = recorded["ids"]["slow"], recorded["ids"]["fast"]
    at = _open("compare", a=str(a), b=str(b))
    ta, tb = timed_step_times(_steps_of(home, a)), timed_step_times(_steps_of(home, b))
    m = _metrics(at)
    for name in ("p50", "p99"):
        ci = speedup_ci(ta, tb, statistic=name)
        assert m[f"latency {name} ratio"] == f"{ci.ratio:.2f}x"
        assert f"{name}: {ci.describe()}" in " ".join(c.value for c in at.caption)
    # the slow job pauses 50 ms between requests, the fast one 2 ms: a gap that holds
    # when a loaded machine adds tens of ms to a request (20 ms did not)
    assert speedup_ci(ta, tb, statistic="p50").verdict == "faster"
    at = _open("compare", a=str(recorded["ids"]["train"]), b=str(b))
    assert "latency p50 ratio" not in _metrics(at)


# -- experiments ---------------------------------------------------------------------------
@pytest.mark.slow
def test_experiment_latency_ratios(recorded: dict) -> None:
    home = recorded["home"]
    ids = recorded["ids"]
    ta = timed_step_times(_steps_of(home, ids["slow"]))
    tb = timed_step_times(_steps_of(home, ids["fast"]))
    with RunStore(home) as store:
        out = latency_ratios(store, [ids["slow"]], ta, tb)
        assert latency_ratios(store, [ids["train"]], ta, tb) is None
    assert set(out) == {"p50", "p99"}
    for name, q in (("p50", 50), ("p99", 99)):
        expected = np.percentile(ta, q) / np.percentile(tb, q)
        assert out[name]["ratio"] == pytest.approx(expected, abs=1e-4)
        lo, hi = out[name]["ci"]
        assert lo <= out[name]["ratio"] <= hi
        assert out[name]["n"] == [ta.size, tb.size]
        assert out[name]["baseline_s"] == pytest.approx(np.percentile(ta, q), abs=1e-6)


@pytest.mark.slow
def test_optimize_reports_latency_ratios_for_inference(home: Path, recorded: dict) -> None:
    """A real experiment on the inference run (one fix, one short trial per arm): each
    candidate carries p50/p99 ratios, and the CLI's table and the Optimize page show them."""
    home = recorded["home"]
    result = json.loads(
        stepscope(
            home,
            "optimize",
            "infer",
            "--fixes",
            "channels_last",
            "--steps",
            "8",
            "--trials",
            "1",
            "--json",
        ).stdout
    )
    cand = result["candidates"][0]
    assert cand["status"] == "completed", cand["error"]
    with RunStore(home) as store:
        base_s = np.concatenate(
            [timed_step_times(store.steps(r)) for r in result["baseline"]["runs"]]
        )
        cand_s = np.concatenate([timed_step_times(store.steps(r)) for r in cand["runs"]])
    for name, q in (("p50", 50), ("p99", 99)):
        lat = cand["latency"][name]
        ratio = np.percentile(base_s, q) / np.percentile(cand_s, q)
        assert lat["ratio"] == pytest.approx(ratio, abs=1e-4)
        assert lat["ci"][0] <= lat["ratio"] <= lat["ci"][1]
    buf = io.StringIO()
    render(result, term.console(file=buf))
    header = next(line for line in buf.getvalue().splitlines() if "candidate" in line)
    assert "p50 latency" in header and "p99 latency" in header
    row = next(line for line in buf.getvalue().splitlines() if "channels_last" in line)
    assert f"{cand['latency']['p99']['ratio']:.2f}x" in row
    at = _open("optimize", experiment=str(result["experiment_id"]))
    table = next(df.value for df in at.dataframe if "p99 latency ratio" in df.value.columns)
    row = table[table["candidate"] == cand["name"]].iloc[0]
    assert row["p50 latency ratio"] == cand["latency"]["p50"]["ratio"]
    assert row["p99 latency ratio"] == cand["latency"]["p99"]["ratio"]
