"""The generation fixes inside a real job, and the installer's generate() point.

Each job is ``tests/jobs/gen_fixes.py`` (a GPT-2 from a config, ``generate()`` once per
prompt) run under the bootstrap with a plan file, as an experiment's trial is; the fixes
are checked on what the job produced (its greedy tokens, against a run without them)
and on what it reported as applied (``config["applied"]``, read back). The point's
refusals are also checked in this process, on a real model, where a job per case would
only be slower.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from stepscope import fixes as catalog
from stepscope.collectors.launch.contract import ENV_PLAN
from stepscope.fixes.install import PlanApplier
from stepscope.store import RunStore

_spec = importlib.util.spec_from_file_location(
    "stepscope_test_jobs_util", Path(__file__).parent / "jobs" / "util.py"
)
jobs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(jobs)


def record(home: Path, *args: str, plan: dict | None = None):
    """Run the probe job under the bootstrap; (its PROBE dict, run row, requests)."""
    env = dict(jobs.torch_threads_env())
    if plan is not None:
        path = home / f"plan{len(list(home.glob('plan*.json')))}.json"
        path.write_text(json.dumps({"fixes": plan, "seed": 0}))
        env[ENV_PLAN] = str(path)
    run_id, proc = jobs.run_job(home, "gen_fixes.py", *args, extra_env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    probe = next(ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE "))
    with RunStore(home) as store:
        return json.loads(probe[6:]), store.run(run_id), store.requests(run_id)


def applied(run: dict, fix: str) -> list[dict]:
    return [e for e in run["config"].get("applied", []) if e["fix"] == fix]


def took_effect(run: dict, fix: str) -> str | None:
    return catalog.get(fix).took_effect(run["config"].get("applied", []))


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The greedy tokens of the job without fixes (SDPA attention, transformers' default)."""
    probe, _, _ = record(tmp_path_factory.mktemp("baseline"))
    answers = probe["answers"]
    assert len({str(a) for a in answers}) == len(answers)  # the prompts get other answers
    assert all(len(set(a[0])) > 1 for a in answers)  # not one repeated token
    return probe


@pytest.fixture(scope="module")
def draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A smaller GPT-2 with the same vocabulary, saved as a model folder."""
    path = tmp_path_factory.mktemp("draft") / "draft"
    job = Path(__file__).parent / "jobs" / "gen_fixes.py"
    subprocess.run([sys.executable, str(job), "--save-draft", str(path)], check=True, timeout=120)
    return path


# -- in the job ---------------------------------------------------------------------------


def test_static_cache_keeps_the_greedy_tokens(tmp_path: Path, baseline: dict) -> None:
    """With SDPA on an SDPA model in the same plan: that one is not applied, and says why."""
    probe, run, requests = record(tmp_path, plan={"static_cache": {}, "sdpa_attention": {}})
    assert probe["answers"] == baseline["answers"]
    (entry,) = applied(run, "static_cache")  # three calls, recorded once
    assert entry["change"] == "generate(cache_implementation='static') (not set by the job)"
    assert entry["applied"] and entry["verified"]
    assert took_effect(run, "static_cache") is None
    (sdpa,) = applied(run, "sdpa_attention")
    assert not sdpa["applied"]
    assert took_effect(run, "sdpa_attention") == "GPT2LMHeadModel already runs SDPA attention"
    assert len(requests) == 3 and set(requests["status"]) == {"done"}


def test_prompt_lookup_keeps_the_greedy_tokens(tmp_path: Path, baseline: dict) -> None:
    probe, run, _ = record(tmp_path, plan={"prompt_lookup": {}})
    assert probe["answers"] == baseline["answers"]
    (entry,) = applied(run, "prompt_lookup")
    assert entry["change"].startswith("generate(prompt_lookup_num_tokens=10)")
    assert entry["applied"] and entry["verified"]


def test_sdpa_switches_an_eager_model_and_keeps_its_tokens(tmp_path: Path) -> None:
    eager, _, _ = record(tmp_path, "--eager")
    assert eager["attn_implementation"] == "eager"
    probe, run, _ = record(tmp_path, "--eager", plan={"sdpa_attention": {}})
    assert probe["attn_implementation"] == "sdpa"
    assert probe["answers"] == eager["answers"]
    (entry,) = applied(run, "sdpa_attention")
    assert entry["change"] == "GPT2LMHeadModel attention eager -> sdpa (set_attn_implementation)"
    assert entry["applied"] and entry["verified"]


def test_speculative_decoding_with_a_draft_model(
    tmp_path: Path, baseline: dict, draft: Path
) -> None:
    probe, run, requests = record(tmp_path, plan={"speculative_decoding": {"path": str(draft)}})
    assert probe["answers"] == baseline["answers"]
    (entry,) = applied(run, "speculative_decoding")
    assert entry["change"] == (
        f"generate(assistant_model=GPT2LMHeadModel from {draft}) (not set by the job)"
    )
    assert entry["applied"] and entry["verified"]
    assert len(requests) == 3  # the draft's own generate() calls are part of each request


def test_sampling_calls_get_no_assisted_generation(tmp_path: Path, draft: Path) -> None:
    plan = {"prompt_lookup": {}, "speculative_decoding": {"path": str(draft)}}
    _, run, _ = record(tmp_path, "--sample", plan=plan)
    for fix, what in (("prompt_lookup", "prompt lookup"), ("speculative_decoding", "speculative")):
        (entry,) = applied(run, fix)
        assert not entry["applied"]
        assert took_effect(run, fix) == (
            f"a sampling call: {what}{' decoding' if fix != 'prompt_lookup' else ''} keeps the "
            "tokens identical only for greedy decoding"
        )


def test_static_cache_with_a_compiled_decode_step(tmp_path: Path, baseline: dict) -> None:
    """transformers compiles the decode step on the CPU only when asked to
    (``CompileConfig._compile_all_devices``); read back at the second call."""
    probe, run, _ = record(tmp_path, plan={"static_cache_compile": {}})
    assert probe["compiled"]
    assert probe["answers"] == baseline["answers"]
    (entry,) = applied(run, "static_cache_compile")
    assert entry["change"] == (
        "generate(cache_implementation='static', compile_config=CompileConfig(mode='default', "
        "all devices)): the decode step ran compiled (model._compiled_call)"
    )
    assert entry["applied"] and entry["verified"]


# -- the generate() point, in this process ---------------------------------------------------


@pytest.fixture(scope="module")
def model():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=64,
        bos_token_id=None, eos_token_id=None, pad_token_id=0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config).eval()


def applier(fixes: dict, override: bool = True) -> PlanApplier:
    return PlanApplier({"fixes": fixes, "override_explicit": override}, writer=lambda: None)


def test_assisted_generation_takes_one_row_read_from_the_call(model, tmp_path: Path) -> None:
    point = applier({"prompt_lookup": {}, "speculative_decoding": {}})
    two = torch.ones((2, 5), dtype=torch.long)
    assert point.on_generate(model, {"input_ids": two}) == {"input_ids": two}
    one = torch.ones((1, 5), dtype=torch.long)
    kwargs = point.on_generate(model, {"do_sample": False}, (one,))  # the prompt positional
    assert kwargs == {"do_sample": False, "prompt_lookup_num_tokens": 10}
    point.on_generate(model, {}, (one,))
    changes = [(e["fix"], e["change"]) for e in point.applied]
    assert changes == [  # each once, over three calls
        ("prompt_lookup", "not applied: 2 prompt rows per call: transformers' assisted "
         "generation takes one"),
        ("speculative_decoding", "not applied: no draft model given (`stepscope optimize "
         "RUN --draft-model PATH`)"),
        ("prompt_lookup", "generate(prompt_lookup_num_tokens=10) (not set by the job)"),
    ]  # fmt: skip
    folder = tmp_path / "none"
    missing = applier({"speculative_decoding": {"path": str(folder)}})
    assert missing.on_generate(model, {"input_ids": one}) == {"input_ids": one}
    expected = f"not applied: no model folder at {folder} (the draft model given)"
    assert missing.applied[0]["change"] == expected


def test_an_explicit_argument_is_replaced_or_kept_as_the_plan_says(model) -> None:
    call = {"cache_implementation": "dynamic"}
    replaced = applier({"static_cache": {}}).on_generate(model, dict(call))
    assert replaced == {"cache_implementation": "static"}
    kept = applier({"static_cache": {}}, override=False)
    assert kept.on_generate(model, dict(call)) == call
    assert kept.applied[0]["change"] == (
        "not applied: kept the call's cache_implementation='dynamic' (set explicitly; "
        "--keep-explicit)"
    )
    off = applier({"static_cache": {}})
    assert off.on_generate(model, {"use_cache": False}) == {"use_cache": False}
    assert "kv_cache comes first" in off.applied[0]["change"]


def test_a_static_cache_and_assisted_generation_are_not_combined(model) -> None:
    """transformers' assisted generation checks candidate tokens past a static cache's end
    (an index error inside generate()): the combination is refused, the first fix kept."""
    one = torch.ones((1, 5), dtype=torch.long)
    both = applier({"static_cache": {}, "prompt_lookup": {}})
    assert both.on_generate(model, {"input_ids": one}) == {
        "input_ids": one,
        "cache_implementation": "static",
    }
    refused = [e["change"] for e in both.applied if e["fix"] == "prompt_lookup"]
    assert refused == [
        "not applied: a static cache ends at the answer's length and prompt lookup checks "
        "tokens past it"
    ]
    job_lookup = applier({"static_cache": {}})
    call = {"input_ids": one, "prompt_lookup_num_tokens": 4}
    assert job_lookup.on_generate(model, dict(call)) == call
    assert "assisted generation" in job_lookup.applied[0]["change"]
