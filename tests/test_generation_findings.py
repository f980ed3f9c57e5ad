"""The generation findings: on real recorded generation jobs, and at their thresholds.

The jobs are ``tests/jobs/gen_findings.py`` (a nanoGPT-style loop with no KV cache, and
Hugging Face ``generate()`` with its cache) run under the bootstrap; the diagnosis reads
the requests their step timer recorded. The thresholds' edges are checked on evidence
built from request rows shaped as the store keeps them, through the same analyses
(``generation_summary``, ``timed_requests``, ``token_latencies``) the run's go through.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from calibrations import ROUND_CALIBRATION

from stepscope.analyzers.rules.diagnosis import diagnose, diagnose_run
from stepscope.analyzers.rules.evidence import Evidence, generation_facts
from stepscope.analyzers.rules.generation import (
    decode_batch_one,
    long_prefill,
    no_kv_cache,
)
from stepscope.analyzers.rules.inference import inference_grad, small_batch
from stepscope.analyzers.rules.recommend import recommend
from stepscope.analyzers.rules.thresholds import (
    DECODE_MIN,
    LONG_PREFILL_MIN,
    NO_CACHE_MIN_GROWTH,
    NO_CACHE_MIN_POSITIONS,
)
from stepscope.analyzers.steps.generation import generation_summary, timed_requests, token_latencies
from stepscope.store import RunStore
from stepscope.store.calibration import save_calibration
from stepscope.types import JobContext

_spec = importlib.util.spec_from_file_location(
    "stepscope_test_jobs_util", Path(__file__).parent / "jobs" / "util.py"
)
jobs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(jobs)

JOB = (Path(__file__).parent / "jobs" / "gen_findings.py").resolve()


def record(home: Path, *args: str, calibrated: bool = False):
    """Run the generation job under the bootstrap; (its run row, its timed requests, its
    diagnosis)."""
    if calibrated:
        save_calibration(home, ROUND_CALIBRATION)
    run_id, proc = jobs.run_job(
        home, "gen_findings.py", *args, extra_env=jobs.torch_threads_env(), timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with RunStore(home) as store:
        timed = timed_requests(store.requests(run_id), store.steps(run_id))
        return store.run(run_id), timed, diagnose_run(store, run_id, save=False)


def keys(diagnosis) -> list[str]:
    return [f.key for f in diagnosis.findings]


# -- real jobs ---------------------------------------------------------------------------


def test_a_loop_without_kv_cache_gets_that_finding_first(tmp_path: Path) -> None:
    _, timed, diagnosis = record(tmp_path, "--mode", "nocache")
    assert set(timed["source"]) == {"loop"}
    first = diagnosis.findings[0]
    assert first.key == "compute/no_kv_cache", keys(diagnosis)
    assert first.phase == "decode"
    slope, growth, where, give_back = first.evidence
    assert slope.value > 0 and "µs per token of context" in slope.text
    assert growth.value >= NO_CACHE_MIN_GROWTH
    line = next(
        i for i, text in enumerate(JOB.read_text().splitlines(), 1) if "logits = self(cond)" in text
    )
    assert where.text.endswith(f"generate ({JOB}:{line})"), where.text
    assert 0 < first.share <= 1 and give_back.value == pytest.approx(first.share, abs=1e-4)
    fix = first.fixes[0]
    assert fix.id == "kv_cache" and not fix.auto
    assert f"{JOB}:{line}" in fix.snippet and "cache=cache" in fix.snippet
    # the no-cache decode is not read as a memory-bound batch-of-one decode, nor as a
    # DataLoader's batch of one
    assert not {"memory/decode_batch_one", "compute/small_batch"} & set(keys(diagnosis))


def test_generate_with_its_cache_decodes_at_batch_one_against_the_roof(tmp_path: Path) -> None:
    run, timed, diagnosis = record(tmp_path, "--mode", "generate", "--new", "48", calibrated=True)
    assert "compute/no_kv_cache" not in keys(diagnosis)
    assert "compute/small_batch" not in keys(diagnosis)
    found = {f.key: f for f in diagnosis.findings}
    decode = found["memory/decode_batch_one"]
    assert decode.evidence[0].value == 1.0  # every timed request one row
    # the roof: the model's float32 weights plus its KV cache at the tokens' position
    # (mean position; 2 x layers x heads x head size x 4 bytes a token: the facts) over the
    # median decode forward, against the calibration's triad bandwidth (25 GB/s)
    forwards = [seconds for tokens in timed["tokens"] for _, _, seconds in tokens]
    positions = [position for tokens in timed["tokens"] for position, _, _ in tokens]
    model = run["facts"]["model"]
    read = model["parameters"] * 4 + model["kv_bytes_per_token"] * float(np.mean(positions))
    expected = read / float(np.median(forwards)) / 1e9 / 25.0
    roof = next(e for e in decode.evidence if "bandwidth floor" in e.text)
    assert roof.value == pytest.approx(expected, abs=1e-4)  # evidence keeps 4 decimals
    assert "of this machine's bandwidth floor" in roof.text and "Test CPU" in roof.text
    assert any("--sweep batch" in e.text for e in decode.evidence)
    offered = [f.id for f in decode.fixes]
    assert {"static_cache", "static_cache_compile", "prompt_lookup"} <= set(offered)
    skipped = {s.id: s.reason for s in decode.skipped}
    assert skipped["speculative_decoding"] == "needs draft_model"
    assert skipped["sdpa_attention"] == "needs eager_attention"


def test_long_prompts_are_a_prefill_finding(tmp_path: Path) -> None:
    _, _, diagnosis = record(
        tmp_path, "--mode", "generate", "--prompt", "400", "--new", "4", "--requests", "4"
    )
    found = {f.key: f for f in diagnosis.findings}
    prefill = found["compute/long_prefill"]
    assert prefill.share >= LONG_PREFILL_MIN and prefill.phase == "prefill"
    assert "400-token prompts" in prefill.title
    assert "memory/decode_batch_one" not in found  # four new tokens: the prompt dominates


# -- thresholds, on request rows -----------------------------------------------------------


def request(
    i: int,
    times: list[float],
    first: int = 9,
    rows: int = 1,
    prefill: float = 0.002,
    other: float = 0.0,
    source: str = "loop",
    **meta: Any,
) -> dict[str, Any]:
    """One finished request as the store keeps it: a prefill, then one forward per new
    token at positions ``first``, ``first + 1``... taking ``times`` seconds each."""
    tokens, offset = [], prefill
    for k, seconds in enumerate(times):
        tokens.append([first + k, offset, seconds])
        offset += seconds
    latency = offset + other
    return {
        "run_id": 1,
        "rank": 0,
        "request": i,
        "step": i,
        "source": source,
        "status": "done",
        "start_s": 100.0 * i,
        "end_s": 100.0 * i + latency,
        "rows": rows,
        "prompt_tokens": (first - 1) * rows,
        "new_tokens": (len(times) + 1) * rows,
        "positions": len(times) + 1,
        "ttft_s": prefill,
        "prefill_s": prefill,
        "decode_s": float(sum(times)),
        "forwards": len(times) + 1,
        "peak_rss_bytes": None,
        "peak_cuda_bytes": None,
        "profiled": 0,
        "tokens": tokens,
        "meta": meta or {"site": "generate (sample.py:12)"},
    }


def evidence(rows: list[dict[str, Any]], **context: Any) -> Evidence:
    requests = pd.DataFrame(rows)
    timed = timed_requests(requests, None)
    facts = {
        "model": {"class": "GPT", "parameters": 1_000_000, "param_dtype": "float32"},
        "forward": {"steps": len(rows), "grad_steps": 0, "train_mode_steps": 0},
        "generation": generation_facts(requests),
    }
    facts.update(context.pop("facts", {}))
    calibration = context.pop("calibration", None)
    return Evidence(
        level="steps",
        context=JobContext(training=False, facts=facts, **context),
        steps={"timed_steps": len(rows), "samples_per_s": 1.0, "steps_per_s": 1.0},
        requests=requests,
        generation=generation_summary(requests, None),
        timed=timed,
        tokens=token_latencies(timed),
        calibration=calibration,
    )


def linear(growth: float, n: int = 40, start: float = 0.001) -> list[float]:
    """Forward times rising linearly by ``growth`` from the first to the last position."""
    return list(np.linspace(start, start * growth, n))


def test_no_cache_needs_the_growth_the_fit_and_the_positions() -> None:
    above = [request(i, linear(NO_CACHE_MIN_GROWTH * 1.05)) for i in range(3)]
    found = no_kv_cache(evidence(above))
    assert found is not None and found.evidence[1].value == pytest.approx(1.575, rel=1e-3)
    below = [request(i, linear(NO_CACHE_MIN_GROWTH * 0.95)) for i in range(3)]
    assert no_kv_cache(evidence(below)) is None
    few = NO_CACHE_MIN_POSITIONS - 1
    assert no_kv_cache(evidence([request(0, linear(5.0, n=few))])) is None
    assert no_kv_cache(evidence([request(0, linear(5.0, n=few + 1))])) is not None


def test_no_cache_share_is_what_a_cache_gives_back() -> None:
    """Every token at the first position's cost: the rise above it is the give-back."""
    times = linear(4.0)
    found = no_kv_cache(evidence([request(0, times, other=0.01)]))
    saved = sum(t - times[0] for t in times)
    assert found.share == pytest.approx(saved / (0.002 + sum(times) + 0.01), rel=1e-6)
    assert found.cost == found.share  # waste: it ranks at its full share


def test_no_cache_is_robust_to_forwards_slowed_by_other_work() -> None:
    rng = np.random.default_rng(0)
    rows = []
    for i in range(3):
        times = np.array(linear(3.0))
        hit = rng.random(len(times)) < 0.3  # a scheduler slice longer, now and then
        rows.append(request(i, list(times + hit * 0.004)))
    found = no_kv_cache(evidence(rows))
    assert found is not None
    assert found.evidence[1].value == pytest.approx(3.0, rel=0.05)


def test_a_flat_decode_or_generate_with_its_cache_is_no_finding() -> None:
    rng = np.random.default_rng(1)
    flat = [request(i, list(0.001 + rng.random(40) * 0.0002)) for i in range(3)]
    assert no_kv_cache(evidence(flat)) is None
    # a rise in generate() with the cache on is attention over a long cache, not a
    # missing cache; with use_cache=False it is the missing cache
    cached = [request(i, linear(3.0), source="generate", use_cache=True) for i in range(3)]
    assert no_kv_cache(evidence(cached)) is None
    off = [request(i, linear(3.0), source="generate", use_cache=False) for i in range(3)]
    found = no_kv_cache(evidence(off))
    assert found is not None and "use_cache=False" in found.evidence[2].text


def test_decode_at_batch_one_needs_most_of_the_request_and_one_row() -> None:
    times = [0.001] * 40
    decode = sum(times)

    def with_decode_share(share: float, rows: int = 1) -> Evidence:
        other = decode / share - decode - 0.002
        rows_ = [
            request(i, times, rows=rows, source="generate", use_cache=True, other=other)
            for i in range(3)
        ]
        return evidence(rows_)

    assert decode_batch_one(with_decode_share(DECODE_MIN + 0.01)) is not None
    assert decode_batch_one(with_decode_share(DECODE_MIN - 0.01)) is None
    assert decode_batch_one(with_decode_share(0.9, rows=2)) is None


def test_decode_roof_reads_the_gpu_datasheet_or_says_it_has_no_calibration() -> None:
    rows = [request(i, [0.002] * 40, source="generate", use_cache=True) for i in range(3)]
    billion = {"model": {"parameters": 1_000_000_000, "param_dtype": "bfloat16"}}
    on_h100 = evidence(rows, cuda=True, device_name="NVIDIA H100 80GB HBM3", facts=billion)
    found = decode_batch_one(on_h100)
    roof = next(e for e in found.evidence if "bandwidth floor" in e.text)
    assert roof.value == pytest.approx(2e9 / 0.002 / 1e9 / 3350, abs=1e-4)  # 1 TB/s of 3.35
    assert "H100 SXM's bandwidth floor" in roof.text and "30 %" in found.title
    uncalibrated = decode_batch_one(evidence(rows))
    assert any("no calibration for this host" in e.text for e in uncalibrated.evidence)
    assert "bandwidth floor" not in uncalibrated.title
    kv = {"model": {"parameters": 10_000_000, "param_dtype": "float32", "kv_bytes_per_token": 1e5}}
    with_kv = evidence(rows, facts=kv, calibration=ROUND_CALIBRATION)
    roof = next(e for e in decode_batch_one(with_kv).evidence if "bandwidth floor" in e.text)
    mean_position = np.mean(range(9, 49))  # the cache read at each decoded position
    assert roof.value == pytest.approx((4e7 + 1e5 * mean_position) / 0.002 / 1e9 / 25, abs=1e-4)


def test_a_gpu_job_is_advised_the_compiled_static_cache_only() -> None:
    """On a GPU transformers compiles the decode step whenever the cache is static (seen
    on an H200: both arms ran compiled): static_cache alone is a CPU's advice."""
    rows = [request(i, [0.002] * 40, source="generate", use_cache=True) for i in range(3)]
    advice = {}
    for cuda in (False, True):
        found = decode_batch_one(evidence(rows, cuda=cuda))
        recommend(found, evidence(rows, cuda=cuda))
        advice[cuda] = ({f.id for f in found.fixes}, {s.id: s.reason for s in found.skipped})
    assert {"static_cache", "static_cache_compile"} <= advice[False][0]
    assert "static_cache" not in advice[True][0] and "static_cache_compile" in advice[True][0]
    assert (
        "compiles the decode step whenever the cache is static" in advice[True][1]["static_cache"]
    )


def test_long_prefill_edges() -> None:
    def with_prefill_share(share: float) -> Evidence:
        times = [0.001] * 10
        prefill = share * sum(times) / (1 - share)
        return evidence([request(i, times, prefill=prefill) for i in range(3)])

    assert long_prefill(with_prefill_share(LONG_PREFILL_MIN + 0.01)) is not None
    assert long_prefill(with_prefill_share(LONG_PREFILL_MIN - 0.01)) is None


def test_inference_rules_on_a_generation_run() -> None:
    """small_batch's fix is a DataLoader's batch: not for requests; a generate() under
    grad mode still records gradients for nothing."""
    rows = [request(i, [0.001] * 40, source="generate", use_cache=True) for i in range(3)]
    ev = evidence(rows)
    assert small_batch(ev) is None
    assert small_batch(dataclasses.replace(ev, generation=None)) is not None
    grad = {"forward": {"steps": 3, "grad_steps": 3, "train_mode_steps": 0}}
    assert inference_grad(evidence(rows, facts=grad)) is not None


def test_the_no_cache_decode_ranks_before_the_rest() -> None:
    rows = [request(i, linear(8.0, n=120)) for i in range(3)]
    diagnosis = diagnose(evidence(rows))
    assert keys(diagnosis)[0] == "compute/no_kv_cache"
    assert diagnosis.findings[0].fixes[0].id == "kv_cache"
    assert "sample.py:12" in diagnosis.findings[0].fixes[0].snippet
