"""Advice that fits the job (issue 39, item 6), on real runs (issue 27's unit tests are
test_advice_fits.py).

* The Run page's snippet says the parameter value the experiment uses (num_workers).
* A fix predicted at 1.00x or less is listed after the others and never pre-ticked.
* CUDA-only settings are never offered to a CPU job (CUDA graphs: "reduce-overhead"),
  NCCL-only hooks never to gloo DDP.
* persistent_workers only where the loader ran several epochs (the job facts count them).
* int8 dynamic quantisation only where nn.Linear / nn.LSTM blocks exist: GPT-2's are Conv1D.
* Shares of one step that add up to more than 100 % are said to overlap.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from dashboard_helpers import no_errors, open_page

from stepscope import fixes as catalog
from stepscope.analyzers.rules.diagnosis import diagnose_run
from stepscope.analyzers.rules.evidence import context_from_run
from stepscope.analyzers.rules.shares import overlap_note
from stepscope.collectors.launch.launcher import launch_run
from stepscope.optim_runner.trials.plan import choose_fixes
from stepscope.store import RunStore
from stepscope.types import BottleneckClass, Finding, FixAdvice

JOBS = Path(__file__).resolve().parent / "jobs"
# an input-bound loader (5 ms of I/O a sample, 4 a batch) and a little compute a step
LOADER = [sys.executable, str(JOBS / "loader.py"), "--steps", "16", "--io-ms", "5"]


@pytest.fixture(scope="module")
def loader_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two real runs of loader.py: one epoch, and the same steps over four epochs."""
    home = tmp_path_factory.mktemp("advice") / "home"
    out: dict[str, Any] = {"home": home}
    for name, epochs in (("one", "1"), ("four", "4")):
        run_id, code = launch_run(
            [*LOADER, "--compute-ms", "5", "--epochs", epochs],
            home=home,
            quiet=True,
            sample_interval=0.1,
        )
        assert code == 0
        out[name] = run_id
    with RunStore(home) as store:
        out["found"] = {name: diagnose_run(store, out[name]).findings for name in ("one", "four")}
    return out


def _advice(found: list[Finding]) -> tuple[dict[str, FixAdvice], dict[str, str]]:
    fixes = {x.id: x for f in found for x in f.fixes}
    skipped = {s.id: s.reason for f in found for s in f.skipped}
    return fixes, skipped


def test_persistent_workers_only_where_the_loader_ran_several_epochs(loader_runs: dict) -> None:
    with RunStore(loader_runs["home"]) as store:
        one, four = store.run(loader_runs["one"]), store.run(loader_runs["four"])
        assert one["facts"]["dataloaders"][0]["iterations"] == 1
        assert four["facts"]["dataloaders"][0]["iterations"] == 4
    fixes_one, skipped_one = _advice(loader_runs["found"]["one"])
    fixes_four, _ = _advice(loader_runs["found"]["four"])
    assert "dataloader_workers" in fixes_one  # the run is input-bound: advice is given
    assert "persistent_workers" not in fixes_one
    assert skipped_one["persistent_workers"] == "needs several_epochs"
    assert "persistent_workers" in fixes_four


def test_run_page_snippet_says_the_experiments_num_workers(
    loader_runs: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = loader_runs["one"]
    with RunStore(loader_runs["home"]) as store:
        planned = {p.id: p for p in choose_fixes(store, run_id, ["dataloader_workers"])}
        catalog_snippet = catalog.get("dataloader_workers").snippet
    workers = planned["dataloader_workers"].params["num_workers"]
    monkeypatch.setenv("STEPSCOPE_HOME", str(loader_runs["home"]))
    at = open_page("run", run=str(run_id))
    no_errors(at)
    snippets = [c.value for c in at.code if "DataLoader(" in c.value]
    assert snippets, "no DataLoader snippet on the Run page"
    shown = {int(n) for s in snippets for n in re.findall(r"num_workers=(\d+)", s)}
    assert shown == {workers}, (shown, workers, catalog_snippet)


def test_a_fix_predicted_at_one_or_less_is_listed_last_and_unticked(
    loader_runs: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real run's findings, with its best fix's bound set to 1.00x (what the page
    saw): the Run page lists it after the others, the Optimize form leaves it unticked."""
    run_id = loader_runs["four"]
    with RunStore(loader_runs["home"]) as store:
        found = store.findings(run_id)
        top = found[0]
        assert len([x for x in top.fixes if x.auto]) >= 2
        first = top.fixes[0]
        top.fixes[0] = dataclasses.replace(first, predicted_speedup=1.0)
        store.save_findings(run_id, found)
    monkeypatch.setenv("STEPSCOPE_HOME", str(loader_runs["home"]))
    run_page = open_page("run", run=str(run_id))
    no_errors(run_page)
    lines = [m.value for m in run_page.markdown if m.value.startswith(":material/build:")]
    titles = [line for line in lines if any(x.title in line for x in top.fixes)]
    assert first.title in titles[-1] and "predicted up to **1.00x**" in titles[-1]
    assert first.title not in titles[0]
    form = open_page("optimize", run=str(run_id), new="1")
    no_errors(form)
    boxes = {b.key.removeprefix(f"fix_{run_id}_"): b for b in form.checkbox}
    assert first.id in boxes and not boxes[first.id].value
    others = [x.id for x in top.fixes if x.auto and x.id != first.id and not x.needs_consent]
    assert any(boxes[i].value for i in others if i in boxes)  # the rest stay ticked
    assert list(boxes).index(first.id) > max(list(boxes).index(i) for i in others if i in boxes)


@pytest.fixture(scope="module")
def gpt2_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A real CPU generation run: a small GPT-2 from a config, generate() per request."""
    pytest.importorskip("transformers")
    home = tmp_path_factory.mktemp("gpt2") / "home"
    job = [sys.executable, str(JOBS / "generate_hf.py"), "--requests", "4", "--new", "6"]
    run_id, code = launch_run(job, home=home, quiet=True)
    assert code == 0
    return home, run_id


def test_no_int8_to_gpt2_and_no_cuda_settings_to_a_cpu_job(gpt2_run: tuple[Path, int]) -> None:
    home, run_id = gpt2_run
    with RunStore(home) as store:
        run = store.run(run_id)
        diagnosis = diagnose_run(store, run_id)
    ctx = context_from_run(run)
    assert ctx.cuda is False and ctx.training is False
    assert run["facts"]["model"]["class"] == "GPT2LMHeadModel"
    assert "Linear" in run["facts"]["model"]["quantizable"]  # its output head alone
    int8 = catalog.get("int8_dynamic_quant")
    assert int8.requirement_status(ctx)[0] == ["linear_or_lstm"]
    offered = [x for f in diagnosis.findings for x in f.fixes]
    assert "int8_dynamic_quant" not in {x.id for x in offered}
    for fix in offered:  # nothing of CUDA in what a CPU job is told
        assert "reduce-overhead" not in fix.snippet and "CUDA graph" not in fix.snippet
    # torch.compile's advice for this CPU inference job: no CUDA graphs
    compiled = catalog.get("torch_compile").fitting(ctx).snippet
    assert "reduce-overhead" not in compiled and "CUDA" not in compiled
    gpu = dataclasses.replace(ctx, cuda=True)
    assert 'mode="reduce-overhead"' in catalog.get("torch_compile").fitting(gpu).snippet
    static = catalog.get("static_cache_compile").fitting(ctx).snippet
    assert "CUDA graphs" not in static and 'mode="default"' in static


def test_bf16_compression_never_to_gloo_ddp(loader_runs: dict) -> None:
    """The real CPU run's context as a gloo DDP job reports it (its model's ``ddp``
    facts with ``backend``): the NCCL hook is not offered; an NCCL job's is."""
    with RunStore(loader_runs["home"]) as store:
        ctx = context_from_run(store.run(loader_runs["one"]))
    hook = catalog.get("ddp_bf16_compression")
    gloo = dataclasses.replace(
        ctx, ddp=True, facts={**ctx.facts, "model": {"ddp": {"backend": "gloo"}}}
    )
    assert "nccl" in hook.requirement_status(gloo)[0]
    nccl = dataclasses.replace(
        gloo, cuda=True, facts={**ctx.facts, "model": {"ddp": {"backend": "nccl"}}}
    )
    assert hook.requirement_status(nccl)[0] == []


def _finding(title: str, share: float) -> Finding:
    return Finding(
        klass=BottleneckClass.COMPUTE,
        subtype="x",
        title=title,
        share=share,
        confidence=0.9,
        evidence=[],
    )


def test_shares_of_one_step_that_overlap_are_said_to() -> None:
    found = [
        _finding("No KV cache", 0.84),
        _finding("Decode at batch one", 0.56),
        _finding("Host overhead", 0.26),
        _finding("Long prefill", 0.18),
    ]
    note = overlap_note(found)
    assert note is not None
    assert note.startswith("These shares overlap: together they are 184% of the step")
    assert "No KV cache (84%) and Decode at batch one (56%)" in note
    assert "Host overhead (26%) and Long prefill" not in note  # 44 %: could lie apart
    assert overlap_note(found[2:]) is None  # 26 + 18 %: parts of one step
