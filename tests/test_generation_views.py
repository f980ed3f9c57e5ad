"""A generation run's figures where a user looks: `stepscope show` (JSON and tables), the
Python API's DataFrames and the Run page's Generation section.

One store is recorded for the module with the real CLI: a Hugging Face job (a GPT-2 from a
config; three one-prompt requests, one batched request of two prompts, one request that
raises), a nanoGPT-style decode loop without a KV cache, and a plain inference job
(forward steps, no requests). Each job prints what it did; the views are held against
that and against ``analyzers/steps/generation.py`` on the same store. No speed is asserted.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from dashboard_helpers import no_errors, open_page, stepscope, texts
from streamlit.testing.v1 import AppTest

import stepscope as api
from stepscope.analyzers.steps.generation import (
    REQUEST_COLUMNS,
    TOKEN_COLUMNS,
    generation_summary,
    position_profile,
    timed_requests,
    token_latencies,
)
from stepscope.app.formats import fmt_num, fmt_ratio, fmt_s
from stepscope.store import RunStore

pytestmark = pytest.mark.slow

JOBS = {
    "hf": ("generate_hf.py", "--requests", "3", "--new", "6", "--fail"),
    "loop": ("decode_loop.py", "--samples", "3", "--new", "12"),
}
STATS_KEYS = {"p50", "p90", "p99", "mean"}
SOURCES = {"hf": ["generate"], "loop": ["loop"]}


def _did(stdout: str) -> dict:
    """What the job says it did: its last ``generated: {json}`` line."""
    line = next(x for x in reversed(stdout.splitlines()) if x.startswith("generated: "))
    return json.loads(line.removeprefix("generated: "))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict:
    home = tmp_path_factory.mktemp("generation_views") / "home"
    ids, did = {}, {}
    for name, (script, *args) in JOBS.items():
        proc = stepscope(
            home, "run", "--name", name, "--", sys.executable, f"tests/jobs/{script}", *args
        )
        did[name] = _did(proc.stdout)
    stepscope(home, "run", "--name", "infer", "--", sys.executable, "tests/jobs/infer.py")
    # the decode loop again, one change made: a generation pair for Compare
    loop_b = ("tests/jobs/decode_loop.py", "--samples", "4", "--new", "12")
    stepscope(home, "run", "--name", "loop_b", "--", sys.executable, *loop_b)
    with RunStore(home) as store:
        ids = {name: store.resolve_run(name) for name in (*JOBS, "infer", "loop_b")}
    return {"home": home, "ids": ids, "did": did}


@pytest.fixture
def home(recorded: dict, monkeypatch: pytest.MonkeyPatch, _isolated_store: Path) -> Path:
    """The recorded store as the CLI's and the dashboard's store."""
    monkeypatch.setenv("STEPSCOPE_HOME", str(recorded["home"]))
    return recorded["home"]


def _stored(home: Path, run_id: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    with RunStore(home) as store:
        return store.requests(run_id), store.steps(run_id)


def _show(home: Path, run_id: int) -> dict:
    return json.loads(stepscope(home, "show", str(run_id), "--json").stdout)


# -- stepscope show ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(JOBS))
def test_show_json_has_the_generation_block(recorded: dict, name: str) -> None:
    home, run_id, did = recorded["home"], recorded["ids"][name], recorded["did"][name]
    shown = _show(home, run_id)
    gen = shown["generation"]
    assert gen["requests"] == did["requests"]
    assert gen["new_tokens"] == did["new_tokens"]
    assert gen["prompt_tokens"] == did["prompt_tokens"]
    assert gen["failed"] == did.get("failed", 0) and gen["unfinished"] == 0
    assert gen["sources"] == SOURCES[name]
    for key in ("request_s", "ttft_s", "tpot_s"):
        assert set(gen[key]) == STATS_KEYS
        assert 0 < gen[key]["p50"] <= gen[key]["p90"] <= gen[key]["p99"]
    assert gen["tokens_per_s"] > 0 and gen["requests_per_s"] > 0
    assert gen == generation_summary(*_stored(home, run_id))  # the analyzer's, to the bit
    assert shown["latency"] is None  # never the per-forward "requests"


def test_show_json_of_a_run_without_requests(recorded: dict) -> None:
    shown = _show(recorded["home"], recorded["ids"]["infer"])
    assert shown["generation"] is None
    assert shown["latency"]["count"] > 0  # an inference run keeps its latency block


def test_show_text_prints_the_generation_figures(recorded: dict) -> None:
    home, run_id, did = recorded["home"], recorded["ids"]["hf"], recorded["did"]["hf"]
    gen = _show(home, run_id)["generation"]
    out = stepscope(home, "show", str(run_id)).stdout
    assert "generation (generate)" in out and "latency (inference" not in out
    assert f"{did['requests']} ({gen['timed_requests']} timed)" in out
    lines = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") > 2}
    assert lines["failed"].split("│")[2].strip() == str(did["failed"])
    assert lines["new tokens"].split("│")[2].strip() == fmt_num(did["new_tokens"])
    assert lines["tokens/s"].split("│")[2].strip() == fmt_num(gen["tokens_per_s"])
    for key, label in (
        ("request_s", "request latency"),
        ("ttft_s", "time to first token"),
        ("tpot_s", "time per output token"),
    ):
        cells = [c.strip() for c in lines[label].split("│")[2:6]]
        assert cells == [fmt_s(gen[key][q]) for q in ("p50", "p90", "p99", "mean")]
    other = stepscope(home, "show", str(recorded["ids"]["infer"])).stdout
    assert "latency (inference" in other and "generation (" not in other


# -- the Python API ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(JOBS))
def test_api_requests_and_tokens(recorded: dict, name: str) -> None:
    home, run_id, did = recorded["home"], recorded["ids"][name], recorded["did"][name]
    stored, steps = _stored(home, run_id)
    run = api.run(run_id, home=home)
    requests = run.requests
    assert list(requests.columns) == REQUEST_COLUMNS
    assert len(requests) == did["requests"]
    assert requests["request"].tolist() == list(range(did["requests"]))
    assert int(requests["new_tokens"].fillna(0).sum()) == did["new_tokens"]
    done = requests["status"] == "done"
    assert int((~done).sum()) == did.get("failed", 0)
    expected = (stored["end_s"] - stored["start_s"]).where(stored["status"] == "done")
    np.testing.assert_allclose(requests["latency_s"], expected)
    assert requests.loc[~done, "latency_s"].isna().all()  # a failed request is never timed
    assert (requests.loc[done, "ttft_s"] < requests.loc[done, "latency_s"]).all()

    tokens = run.tokens
    assert list(tokens.columns) == TOKEN_COLUMNS
    per_request = tokens.groupby("request").size()
    finished = stored[stored["status"] == "done"]
    assert per_request.to_dict() == dict(
        zip(finished["request"], finished["forwards"] - 1, strict=True)
    )  # one row per forward after the prefill
    for _, rows in tokens.groupby("request"):
        assert (np.diff(rows["position"]) == 1).all()  # one token further each time
    assert (tokens["latency_s"] >= tokens["forward_s"] - 1e-4).all()  # a forward, then more
    assert run.generation == generation_summary(stored, steps)

    report = api.analyze(run_id, home=home)
    pd.testing.assert_frame_equal(report.requests, requests)
    pd.testing.assert_frame_equal(report.tokens, tokens)
    assert report.summary["generation"] == run.generation
    assert f"requests: {did['requests']}, {did['new_tokens']} new tokens" in repr(report)


def test_api_frames_of_a_run_without_requests(recorded: dict) -> None:
    run = api.run(recorded["ids"]["infer"], home=recorded["home"])
    assert run.requests.empty and list(run.requests.columns) == REQUEST_COLUMNS
    assert run.tokens.empty and list(run.tokens.columns) == TOKEN_COLUMNS
    assert run.generation is None
    report = run.analyze()
    assert report.requests.empty and report.tokens.empty
    assert report.summary["generation"] is None


# -- the Run page -----------------------------------------------------------------------------
def _values(v: object) -> list:
    """A plotly JSON array: a list, or (numpy data) a base64 typed array."""
    if isinstance(v, dict) and "bdata" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]).tolist()
    return list(v)  # type: ignore[call-overload]


def _chart_with(at: AppTest, trace: str) -> dict[str, dict] | None:
    """The traces, by name, of the first chart on the page that has one named ``trace``
    (the step charts below have an "other" too)."""
    for chart in at.get("plotly_chart"):
        traces = {t.get("name"): t for t in json.loads(chart.proto.spec)["data"]}
        if trace in traces:
            return traces
    return None


@pytest.mark.parametrize("name", list(JOBS))
def test_run_page_generation_section(home: Path, recorded: dict, name: str) -> None:
    run_id, did = recorded["ids"][name], recorded["did"][name]
    stored, steps = _stored(home, run_id)
    gen = generation_summary(stored, steps)
    at = open_page("run", run=str(run_id))
    no_errors(at)
    assert "Generation" in [h.value for h in at.subheader]
    shown = {m.label: m.value for m in at.metric}
    assert shown["requests"] == fmt_num(did["requests"])
    assert shown["tokens/s"] == fmt_num(gen["tokens_per_s"])
    assert shown["requests/s"] == fmt_num(gen["requests_per_s"])
    assert shown["TTFT p50"] == fmt_s(gen["ttft_s"]["p50"])
    assert shown["TPOT p50"] == fmt_s(gen["tpot_s"]["p50"])
    assert shown["request p99"] == fmt_s(gen["request_s"]["p99"])
    assert "latency p50" not in shown  # the per-forward latency block: never here
    # the page leads with the requests' figures, each once (issue 39: "peak RSS" first)
    labels = [m.label for m in at.metric]
    assert labels[:3] == ["requests", "tokens/s", "requests/s"], labels
    for label in ("requests", "tokens/s", "requests/s", "TTFT p50", "TPOT p50", "request p99"):
        assert labels.count(label) == 1, labels
    page = texts(at)
    assert f"{fmt_num(did['new_tokens'])} new tokens" in page
    assert f"{fmt_num(did['prompt_tokens'])} prompt tokens" in page
    if did.get("failed"):
        assert any("request(s) raised" in w.value for w in at.warning)

    timed = timed_requests(stored, steps)
    for trace, column in (
        ("request latency", "latency_s"),
        ("time to first token", "ttft_s"),
        ("time per output token", "tpot_s"),
    ):  # each distribution over the timed requests, in ms
        drawn = sorted(_values(_chart_with(at, trace)[trace]["x"]))
        np.testing.assert_allclose(drawn, np.sort(timed[column].to_numpy() * 1e3))
    tokens = token_latencies(stored)
    profile = position_profile(tokens)
    positions = _chart_with(at, "median inter-token latency")
    median = positions["median inter-token latency"]
    assert _values(median["x"]) == profile["position"].astype(float).tolist()
    np.testing.assert_allclose(_values(median["y"]), profile["latency_s"] * 1e3)
    np.testing.assert_allclose(
        _values(positions["median forward time"]["y"]), profile["forward_s"] * 1e3
    )
    np.testing.assert_allclose(
        _values(positions["each request's tokens"]["y"]), tokens["latency_s"] * 1e3
    )
    split = _chart_with(at, "prefill")
    done = stored[stored["status"] == "done"]
    for phase in ("prefill", "decode"):
        np.testing.assert_allclose(_values(split[phase]["y"]), done[f"{phase}_s"] * 1e3)
    assert _values(split["other"]["x"]) == done["request"].astype(str).tolist()

    table = next(df.value for df in at.dataframe if "TTFT" in df.value.columns)
    assert len(table) == did["requests"]
    cells = table.astype(str).to_numpy().ravel().tolist()
    assert not {"nan", "None", "NaN", "<NA>"} & set(cells)  # an unknown figure reads "—"


def test_compare_of_two_generation_runs_gives_their_requests_figures(
    home: Path, recorded: dict
) -> None:
    """tokens/s, TTFT, TPOT and request p50/p99 with intervals and the timed requests each
    rests on; never "samples/s" read from requests (issue 39: "2.79 -> 1.07 samples/s")."""
    a, b = recorded["ids"]["loop"], recorded["ids"]["loop_b"]
    at = open_page("compare", a=str(a), b=str(b))
    no_errors(at)
    ga, gb = (generation_summary(*_stored(home, i)) for i in (a, b))
    shown = {m.label: m.value for m in at.metric}
    assert (
        shown["tokens/s A → B"] == f"{fmt_num(ga['tokens_per_s'])} → {fmt_num(gb['tokens_per_s'])}"
    )
    assert shown["timed requests A / B"] == f"{ga['timed_requests']} / {gb['timed_requests']}"
    # 2 and 3 timed requests: the plain ratio, and no interval or verdict from so few
    assert shown["tokens/s B vs A"] == fmt_ratio(gb["tokens_per_s"] / ga["tokens_per_s"])
    assert not {"samples/s A → B", "median step A", "speed-up B vs A"} & set(shown), shown
    table = next(df.value for df in at.dataframe if "figure" in df.value.columns)
    rows = table.set_index("figure")
    assert list(rows.index) == ["tokens/s", "TTFT p50", "TPOT p50", "request p50", "request p99"]
    assert rows.loc["TTFT p50", "A"] == fmt_s(ga["ttft_s"]["p50"])
    assert rows.loc["request p99", "B"] == fmt_s(gb["request_s"]["p99"])
    assert rows.loc["request p50", "timed requests (A / B)"] == (
        f"{ga['timed_requests']} / {gb['timed_requests']}"
    )
    why = f"no interval: {ga['timed_requests']} and {gb['timed_requests']} timed requests"
    assert all(v.startswith(why) for v in rows["95 % interval"]), rows
    assert set(rows["verdict"]) == {"—"}, rows


def test_run_page_without_requests_has_no_generation_section(home: Path, recorded: dict) -> None:
    at = open_page("run", run=str(recorded["ids"]["infer"]))
    no_errors(at)
    assert "Generation" not in [h.value for h in at.subheader]
    shown = {m.label: m.value for m in at.metric}
    assert "TTFT p50" not in shown and "latency p50" in shown
    # an inference job leads with its latency and requests/s, each said once
    labels = [m.label for m in at.metric]
    assert labels[:3] == ["latency p50", "latency p99", "requests/s"], labels
    assert "step time p50" not in labels and labels.count("latency p50") == 1, labels
    assert _chart_with(at, "median inter-token latency") is None


def test_the_kv_cache_is_measured_where_it_is_held(home: Path, recorded: dict) -> None:
    """The Hugging Face job's cache (a DynamicCache: 2 layers, keys and values of width
    64 in float32) is, at each request's end, its prompt and new tokens but the last,
    per row; `show` and the Run page say it once. The decode loop keeps no cache: no
    line."""
    hf = recorded["ids"]["hf"]
    requests, _ = _stored(home, hf)
    done = requests[requests["status"] == "done"]
    assert len(done) == 4
    for meta, rows in zip(done["meta"], done["rows"], strict=True):
        context = 12 + 6 - 1  # the batched request's prompt is padded to 12 on the left
        assert meta["kv_cache_context"] == context and meta["kv_cache_grows"] is True
        assert meta["kv_cache_bytes"] == 2 * 2 * rows * 64 * context * 4, meta
    kv = generation_summary(*_stored(home, hf))["kv_cache"]
    assert kv["bytes"] == 2 * 2 * 2 * 64 * 17 * 4 and kv["rows"] == 2 and kv["per_token"] == 1024
    assert 0 < kv["share"] < 1 and kv["peak_basis"] == "rss"
    shown = _show(home, hf)["generation"]["kv_cache"]
    assert shown["bytes"] == kv["bytes"]
    out = stepscope(home, "show", str(hf)).stdout
    assert "KV cache" in out and "1.0 KiB per position per row" in out
    at = open_page("run", run=str(hf))
    no_errors(at)
    assert "KV cache 34.0 KiB at its largest (request 3: 2 rows x 17 positions" in texts(at)
    loop = recorded["ids"]["loop"]
    assert generation_summary(*_stored(home, loop))["kv_cache"] is None
    assert _show(home, loop)["generation"]["kv_cache"] is None
    table = stepscope(home, "show", str(loop)).stdout
    assert "│ KV cache " not in table  # (its no_kv_cache finding may name one)
