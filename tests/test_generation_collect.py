"""Requests of text-generation jobs, recorded from unmodified scripts.

``tests/jobs/gen_requests.py`` calls a tiny GPT-2 (built from a config) the ways scripts
do: ``generate()`` per prompt or batched, a decode loop with and without a KV cache; and
the ways that are not generation (token-id batches of one length; a length-sorted
evaluation that grows by one token), the ways generation goes wrong (a generate() that
raises, an empty prompt, ``max_new_tokens=0``, a streamer, a job killed mid-request).
Each job runs once per module; the tests read what the store holds against what the
script printed about itself (``GEN {...}``).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from stepscope.analyzers.steps.generation import generation_summary, request_table
from stepscope.collectors.launch.launcher import launch_run
from stepscope.store import RunStore

JOB = Path(__file__).resolve().parent / "jobs" / "gen_requests.py"
NEW = 10


def _own_counts(output: str) -> dict:
    return json.loads(next(ln for ln in reversed(output.splitlines()) if ln.startswith("GEN "))[4:])


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict]:
    """Each mode's run, recorded once: its store, run id, exit code and own counts."""
    cache: dict[str, dict] = {}

    def get(mode: str) -> dict:
        if mode not in cache:
            home = tmp_path_factory.mktemp(mode)
            out = home / "job.log"
            run_id, code = launch_run(
                [sys.executable, str(JOB), "--mode", mode, "--new", str(NEW)],
                home=home,
                quiet=True,
                output_path=str(out),
            )
            text = out.read_text() if out.exists() else ""
            with RunStore(home) as store:
                cache[mode] = {
                    "home": home,
                    "run": store.run(run_id),
                    "steps": store.steps(run_id),
                    "requests": store.requests(run_id),
                    "code": code,
                    "own": _own_counts(text) if "GEN " in text else None,
                    "output": text,
                }
        return cache[mode]

    return get


@pytest.mark.parametrize(
    ("mode", "source"), [("generate", "generate"), ("nocache", "loop"), ("cache", "loop")]
)
def test_one_step_per_request_never_per_forward(recorded, mode: str, source: str) -> None:
    rec = recorded(mode)
    assert rec["code"] == 0 and rec["run"]["status"] == "completed"
    steps, requests, own = rec["steps"], rec["requests"], rec["own"]
    assert len(steps) == len(requests) == len(own["new_tokens"]) == 4  # not 4 x 10 forwards
    assert set(steps["kind"]) == {"generate"}
    assert set(requests["source"]) == {source} and set(requests["status"]) == {"done"}
    assert requests["new_tokens"].tolist() == own["new_tokens"]
    assert (requests["forwards"] == NEW).all() and (requests["prompt_tokens"] == 12).all()
    assert requests["step"].tolist() == steps["step"].tolist()
    # the request's latency lies inside what the script's own clock says around the call
    # (a loop's request spans its first forward to its last, without picking the last
    # token), and spans the request, not one forward (that would be about a tenth of it).
    # How much shorter it reads is the machine's: a job descheduled between its clock
    # and the call (a loaded CI machine) widens the gap, so no closer bound is asserted.
    table = request_table(requests)
    for ours, theirs in zip(table["latency_s"], own["latencies_s"], strict=True):
        assert theirs / 2 <= ours <= theirs + 0.003
    assert (table["ttft_s"] > 0).all() and (table["ttft_s"] < table["latency_s"]).all()
    positions = [[t[0] for t in tokens] for tokens in requests["tokens"]]
    assert all(len(p) == NEW - 1 for p in positions)  # every forward after the prefill
    assert all(p == sorted(p) and p[-1] - p[0] == NEW - 2 for p in positions)


def test_loops_name_the_line_that_calls_the_model(recorded) -> None:
    for mode in ("nocache", "cache"):
        sites = {m["site"] for m in recorded(mode)["requests"]["meta"]}
        assert len(sites) == 1
        (site,) = sites
        assert site.startswith("loop (") and site.endswith(f"{JOB.name}:" + site.split(":")[-1])


def test_a_batched_call_counts_its_rows_and_leaves_the_padding_out(recorded) -> None:
    rec = recorded("batched")
    (req,) = rec["requests"].itertuples()
    assert (req.rows, req.new_tokens, req.positions) == (4, rec["own"]["new_tokens"][0], NEW)
    assert req.prompt_tokens == 12 + 11 + 10 + 9  # the attention mask's ones, not 4 x 12
    summary = generation_summary(rec["requests"], rec["steps"])
    assert summary["requests"] == 1 and summary["new_tokens"] == 4 * NEW


@pytest.mark.parametrize("mode", ["classify", "growing"])
def test_token_ids_that_do_not_decode_stay_forward_steps(recorded, mode: str) -> None:
    rec = recorded(mode)
    assert rec["requests"].empty
    assert len(rec["steps"]) == 4 and set(rec["steps"]["kind"]) == {"forward"}


def test_a_generate_call_that_raises_is_marked_and_the_exit_code_passes(recorded) -> None:
    rec = recorded("error")
    assert rec["code"] == 1 and rec["run"]["status"] == "failed"
    done, failed = rec["requests"].iloc[0], rec["requests"].iloc[1]
    assert done["status"] == "done" and done["new_tokens"] == rec["own"]["new_tokens"][0]
    assert failed["status"] == "error" and failed["meta"]["error"].startswith("ZeroDivisionError")
    summary = generation_summary(rec["requests"], rec["steps"])
    assert summary["failed"] == 1 and summary["requests"] == 2


def test_empty_prompts_zero_tokens_and_streamers(recorded) -> None:
    rec = recorded("edge")
    assert rec["code"] == 0 and "edge call raised" in rec["output"]
    rows = rec["requests"]
    assert rows["status"].tolist() == ["error", "error", "done", "done"]
    assert "max_new_tokens" in rows["meta"].iloc[1]["error"]
    assert rows["meta"].iloc[2]["streamer"] is True
    assert rows["new_tokens"].iloc[2:].tolist() == rec["own"]["new_tokens"]


def test_a_job_killed_mid_request_keeps_the_finished_ones(tmp_path: Path) -> None:
    log = open(tmp_path / "job.log", "w")  # noqa: SIM115 - the child keeps its own copy
    proc = subprocess.Popen(
        [sys.executable, "-m", "stepscope.app.cli", "--home", str(tmp_path), "run", "--"]
        + [sys.executable, str(JOB), "--mode", "hang", "--new", str(NEW)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while (tmp_path / "job.log").read_text().count("token") < 30:  # well into request 1
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
        job = next(
            c
            for c in __import__("psutil").Process(proc.pid).children()
            if "gen_requests" in " ".join(c.cmdline())
        )
        job.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=60) == 128 + signal.SIGKILL
    finally:
        proc.kill()
        log.close()
    with RunStore(tmp_path) as store:
        run = store.runs().iloc[0]
        requests = store.requests(int(run["id"]))
    assert run["status"] == "killed"
    assert requests["status"].tolist() == ["done", "running"]  # the unfinished one, marked
    summary = generation_summary(requests)
    assert summary["unfinished"] == 1 and summary["requests"] == 2
