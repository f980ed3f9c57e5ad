"""Activation checkpointing applied with no code change, and experiments judged on memory.

The fix finds repeated blocks by class and wraps them with torch's own checkpoint
wrapper at the model's first call (``fixes/catalog/activation_checkpointing.py``); every
trial records its peak memory at exit (``collectors/facts/peak_memory.py``) and each arm
gets its median peak and its ratio to the baseline's (``verdict/peak_memory.py``);
``optimize --goal memory`` keeps the lowest peak within the slowdown allowed. The jobs
are real (tests/jobs/gpt_blocks.py: a GPT-style trainer with a Block class in a
ModuleList and AdamW); peaks are compared with each other, never times.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from stepscope.app.cli.main import build_parser
from stepscope.app.cli.verbs.optimize import optimize_refusal
from stepscope.collectors.launch.launcher import launch_run
from stepscope.fixes import get
from stepscope.fixes.catalog.activation_checkpointing import repeated_blocks
from stepscope.fixes.checkpoint_probe import saved_by_blocks
from stepscope.fixes.points import ModelCall
from stepscope.optim_runner.verdict.peak_memory import (
    memory_best,
    parse_max_slowdown,
    pick_lowest_peak,
    trade_text,
)
from stepscope.store import RunStore

REPO = Path(__file__).resolve().parents[1]
JOBS = REPO / "tests" / "jobs"
JOB = JOBS / "gpt_blocks.py"
# activations well above the weights: the checkpointed arm's peak RSS is clearly lower
# (measured 748 MiB against 0.81x of it), a few seconds a trial on a loaded 2-core machine
BIG = ("--dim", "128", "--blocks", "8", "--batch", "16", "--seq", "256")


def _job_module(path: Path = JOB) -> Any:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _kept_by_autograd(model: torch.nn.Module, blocks: list, x: torch.Tensor) -> int:
    """The bytes of every distinct storage autograd keeps from inside the blocks in a
    real forward (every saved tensor kept alive, so no storage is reused)."""
    inside: list[bool] = []
    kept: dict[int, Any] = {}
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if inside and ptr not in params:
            kept[ptr] = t
        return t

    def enter(*_: Any) -> None:
        inside.append(True)

    def leave(*_: Any) -> None:  # a forward hook's return value replaces the output
        inside.pop()

    handles = [b.register_forward_pre_hook(enter) for _, b in blocks]
    handles += [b.register_forward_hook(leave) for _, b in blocks]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    for handle in handles:
        handle.remove()
    return sum(t.untyped_storage().nbytes() for t in kept.values())


def _call(model: torch.nn.Module, args: tuple = ()) -> ModelCall:
    """The fix's own hook, as the installer calls it at the model's first call; what it
    learns later in the job (a block's probe) is appended to the call's changes."""
    call = ModelCall(
        fix="activation_checkpointing",
        module=model,
        inner=model,
        device=torch.device("cpu"),
        args=args,
        torch=torch,
    )
    get("activation_checkpointing").on_model(call, {})
    return call


def _apply(model: torch.nn.Module, args: tuple = ()) -> list[Any]:
    return [change for _, change in _call(model, args).changes]


def _predicted_mib(text: str) -> float:
    found = re.search(r"predicted saving ([\d.]+) MiB", text)
    assert found is not None, text
    return float(found.group(1))


def _loss_and_grads(model: torch.nn.Module, idx: torch.Tensor) -> tuple[float, list]:
    logits = model(idx[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 128), idx[:, 1:].reshape(-1))
    loss.backward()
    return float(loss.detach()), [p.grad.clone() for p in model.parameters()]


# -- the fix, in process ------------------------------------------------------------------
def test_repeated_blocks_are_wrapped_and_compute_the_same() -> None:
    job = _job_module()
    torch.manual_seed(0)
    plain = job.GPT(128, 32, 3, 16)
    wrapped = job.GPT(128, 32, 3, 16)
    wrapped.load_state_dict(plain.state_dict())
    assert [name for name, _ in repeated_blocks(wrapped, torch)] == [
        "blocks.0",
        "blocks.1",
        "blocks.2",
    ]
    idx = torch.randint(0, 128, (2, 17), generator=torch.Generator().manual_seed(1))
    (change,) = _apply(wrapped, (idx[:, :-1],))  # the probe forward runs on these inputs
    assert change.applied and change.verified is True
    assert "3 Block blocks" in change.text and "predicted saving" in change.text
    saved = re.search(r"the blocks save ([\d.]+) MiB", change.text)
    assert saved is not None and float(saved.group(1)) > 0
    kinds = [type(b).__name__ for b in wrapped.blocks]
    assert kinds == ["CheckpointWrapper"] * 3
    loss_a, grads_a = _loss_and_grads(plain, idx)
    loss_b, grads_b = _loss_and_grads(wrapped, idx)
    assert loss_a == pytest.approx(loss_b, rel=1e-6)
    for a, b in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


class KeywordsOnly(torch.nn.Module):
    """A model called as the Hugging Face Trainer calls one: ``model(**batch)``."""

    def __init__(self, gpt: torch.nn.Module) -> None:
        super().__init__()
        self.gpt = gpt

    def forward(self, *, idx: torch.Tensor) -> torch.Tensor:
        return self.gpt(idx)


def test_a_model_called_with_keywords_is_probed_at_its_first_block() -> None:
    """The installer sees no positional input (torch's global hooks get none of the
    keywords): the first block's own call is probed, and its prediction is the one the
    whole-model probe makes on the same inputs (the blocks are alike)."""
    job = _job_module()
    torch.manual_seed(0)
    reference = job.GPT(128, 32, 4, 16)
    idx = torch.randint(0, 128, (4, 17), generator=torch.Generator().manual_seed(1))
    (whole,) = _apply(reference, (idx[:, :-1],))
    model = KeywordsOnly(job.GPT(128, 32, 4, 16))
    model.gpt.load_state_dict(reference.state_dict())
    call = _call(model)
    (change,) = [c for _, c in call.changes]
    assert change.applied and "4 Block blocks of gpt.blocks" in change.text
    assert "saving predicted at the first block's call" in change.text
    logits = model(idx=idx[:, :-1])
    (_, predicted) = [c for _, c in call.changes]
    assert predicted.applied and "at the first block's call: gpt.blocks.0 saves" in predicted.text
    assert _predicted_mib(predicted.text) == pytest.approx(_predicted_mib(whole.text), rel=0.02)
    model(idx=idx[:, :-1])  # the probe ran once: the hook removed itself
    assert len(call.changes) == 2
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 128), idx[:, 1:].reshape(-1))
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_a_probe_that_fails_says_so_and_the_forward_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from stepscope.fixes import checkpoint_probe

    def refuse(*_args: Any) -> None:
        raise RuntimeError("a block that cannot run twice")

    monkeypatch.setattr(checkpoint_probe, "saved_by_one_block", refuse)
    job = _job_module()
    model = KeywordsOnly(job.GPT(128, 32, 3, 16))
    call = _call(model)
    idx = torch.randint(0, 128, (2, 16))
    assert model(idx=idx).shape == (2, 16, 128)
    (_, counted) = [c for _, c in call.changes]
    assert "predicted from the block count: about 2/3 of their activations freed" in counted.text
    assert "the probe of gpt.blocks.0 failed: RuntimeError" in counted.text


def test_a_resnets_blocks_count_each_saved_storage_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A block's output is saved by its last ReLU and again by the next block's first
    conv: one storage, counted once (it was counted twice, and the corpus's ResNet's
    saving was predicted 30 % over what its peak showed)."""
    monkeypatch.setattr(sys, "argv", ["resnet_highres.py"])  # the script parses at import
    job = _job_module(REPO / "examples" / "corpus" / "resnet_highres.py")
    torch.manual_seed(0)
    model = job.ResNet(width=4, blocks=3)
    blocks = repeated_blocks(model, torch)
    assert [name for name, _ in blocks] == [
        "layer1.0",
        "layer1.1",
        "layer1.2",
        "layer2.0",
        "layer2.1",
    ]
    x = torch.randn(2, 3, 16, 16)
    per_block, inputs = saved_by_blocks(model, blocks, (x,), torch)
    assert sum(per_block) == _kept_by_autograd(model, blocks, x)
    assert inputs == [x.new_empty(2, 4, 16, 16).nbytes] * 3 + [x.new_empty(2, 8, 8, 8).nbytes] * 2
    (change,) = _apply(model, (x,))
    assert "checkpointed 5 BasicBlock blocks of layer1, layer2" in change.text
    assert "their 10 BatchNorm layers update their running statistics twice" in change.text


def test_no_repeated_blocks_is_not_applied_with_the_reason() -> None:
    job = _job_module()
    flat = job.Flat(128, 32)  # a Sequential of Linear, GELU, Linear: layers, not blocks
    (change,) = _apply(flat)
    assert not change.applied and "no repeated blocks" in change.text
    assert not any(type(m).__name__ == "CheckpointWrapper" for m in flat.modules())
    evaluating = job.GPT(128, 32, 2, 16).eval()
    (change,) = _apply(evaluating)
    assert not change.applied and "eval mode" in change.text


# -- the memory goal, its arguments -------------------------------------------------------
def test_max_slowdown_is_a_factor_or_a_percentage_and_bad_input_is_one_line(capsys) -> None:
    assert parse_max_slowdown("1.5x") == parse_max_slowdown("50%") == parse_max_slowdown("0.5")
    for bad in ("2", "0.5x", "-1x", "fast"):
        with pytest.raises(ValueError, match="max slowdown"):
            parse_max_slowdown(bad)
    parser = build_parser()
    for argv, says in (
        (["--goal", "memory", "--max-slowdown", "2"], "max slowdown '2'"),
        (["--goal", "speed"], "'speed': one of time, memory"),
    ):
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args(["optimize", "1", *argv])
        assert exit_.value.code == 2 and says in capsys.readouterr().err
    args = parser.parse_args(["optimize", "1", "--goal", "memory", "--max-slowdown", "1.3x"])
    assert optimize_refusal(args) is None and args.max_slowdown == pytest.approx(1.3)
    timed = parser.parse_args(["optimize", "1", "--max-slowdown", "2x"])
    assert optimize_refusal(timed) == "--max-slowdown is for --goal memory"


def _outcome(name: str, peak: float | None, speedup: float, **kw: Any) -> dict[str, Any]:
    return {
        "name": name,
        "fixes": [name],
        "status": "completed",
        "quality_ok": True,
        "peak_ratio": peak,
        "speedup": speedup,
        "speedup_basis": "samples_per_s",
        **kw,
    }


def test_the_memory_goal_keeps_the_lowest_peak_within_the_slowdown() -> None:
    outcomes = [
        _outcome("a", 0.41, 1 / 1.27),
        _outcome("b", 0.30, 1 / 2.0),  # lower, but too slow for 1.5x
        _outcome("c", 0.20, 1.0, quality_ok=False),  # the guard failed
        _outcome("d", 1.02, 1.3),  # faster, no lower peak
    ]
    assert pick_lowest_peak(outcomes, 1.5)["name"] == "a"
    assert pick_lowest_peak(outcomes, 2.5)["name"] == "b"
    assert trade_text(outcomes[0]) == "peak 0.41x, 1.27x slower per sample"
    top, answer = memory_best(outcomes[3:], 1.5)
    assert top is None and "no candidate lowered the peak within 1.5x" in answer


# -- real runs ------------------------------------------------------------------------------
#: glibc's mapping threshold fixed at 1 MiB for jobs whose peaks are compared: with its
#: default, freed attention tensors stay in a heap that keeps what it held, and the same
#: checkpointed trial's peak RSS moved from 438 to 739 MiB against a baseline's 613 to
#: 729 (a CI run saw the arm above the baseline); fixed, three pairs read 613 / 438 MiB
FIXED_THRESHOLD = {"MALLOC_MMAP_THRESHOLD_": "1048576"}


def _optimize(
    home: Path, run_id: int, *extra: str, env: dict[str, str] | None = None
) -> dict[str, Any]:
    out = subprocess.run(
        [
            *(sys.executable, "-m", "stepscope.app.cli", "--home", str(home), "optimize"),
            *(str(run_id), "--fixes", "activation_checkpointing", "--trials", "1", "--json"),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_checkpointed_arm_has_a_lower_peak_and_the_same_loss(tmp_path: Path) -> None:
    home = tmp_path / "home"
    command = [sys.executable, str(JOB), "--steps", "4", *BIG]
    run_id, code = launch_run(command, home=home, max_steps=4, quiet=True)
    assert code == 0
    result = _optimize(
        home, run_id, "--steps", "4", "--goal", "memory", "--max-slowdown", "100x",
        env=FIXED_THRESHOLD,
    )  # fmt: skip
    (cand,) = result["candidates"]
    assert cand["status"] == "completed", cand
    assert result["baseline"]["peak_bytes"] > 0 and cand["peak_basis"] == "rss"
    assert cand["peak_bytes"] < result["baseline"]["peak_bytes"]
    assert cand["peak_ratio"] < 1 and cand["trade"].startswith(f"peak {cand['peak_ratio']:.2f}x")
    assert cand["quality_ok"] is True  # the loss guard: the same loss
    best = result["best"]
    assert best["goal"] == "memory" and best["fixes"] == ["activation_checkpointing"]
    assert "lowest peak within 100x" in best["answer"] and best["peak_ratio"] == cand["peak_ratio"]
    with RunStore(home) as store:
        recorded = store.run(run_id)
        trial = store.run(cand["runs"][0])
        base_trial = result["baseline"]["runs"][0]
        losses = store.steps(cand["runs"][0])["loss"].to_numpy(dtype=float)
        base_losses = store.steps(base_trial)["loss"].to_numpy(dtype=float)
    assert recorded["config"]["peak_memory"]["rss_bytes"] > 0  # the recorded run has it too
    applied = [e for e in trial["config"]["applied"] if e["fix"] == "activation_checkpointing"]
    assert len(applied) == 1 and applied[0]["applied"] and applied[0]["verified"] is True
    assert "8 Block blocks" in applied[0]["change"]
    assert "predicted saving" in applied[0]["change"]  # the probe ran on the job's inputs
    assert len(losses) == len(base_losses) == 4
    np.testing.assert_allclose(losses, base_losses, rtol=1e-5)  # numerics unchanged


def test_a_job_without_repeated_blocks_says_not_applied(tmp_path: Path) -> None:
    home = tmp_path / "home"
    command = [sys.executable, str(JOB), "--steps", "3", "--flat", "--batch", "2"]
    run_id, code = launch_run(command, home=home, max_steps=3, quiet=True)
    assert code == 0
    result = _optimize(home, run_id, "--steps", "3", "--goal", "memory")
    (cand,) = result["candidates"]
    assert cand["status"] == "not_applied"
    (why,) = cand["not_applied"]
    assert why["fix"] == "activation_checkpointing" and "no repeated blocks" in why["why"]
    assert (
        result["best"]["fixes"] == []
        and "no candidate lowered the peak" in (result["best"]["answer"])
    )


def test_a_hugging_face_model_gets_its_own_switch_and_a_prediction() -> None:
    """The Trainer calls ``model(**batch)``: the saving is predicted at the first
    layer's call, equal to the whole-model probe's on positional inputs, and the probe
    moves neither the loss nor the gradients (dropout's RNG is restored after it)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=4, n_embd=32, n_head=2, vocab_size=64, n_positions=64, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    plain = transformers.GPT2LMHeadModel(config).train()
    blocks = repeated_blocks(plain, torch)
    assert [n for n, _ in blocks] == [f"transformer.h.{i}" for i in range(4)]
    ids = torch.randint(0, 64, (4, 64), generator=torch.Generator().manual_seed(1))
    per_block, inputs = saved_by_blocks(plain, blocks, (ids,), torch)
    whole = (sum(per_block) - max(per_block) - sum(inputs)) / 2**20
    model = transformers.GPT2LMHeadModel(config).train()
    model.load_state_dict(plain.state_dict())
    call = _call(model)
    (change,) = [c for _, c in call.changes]
    assert change.applied and change.verified is True
    assert "GPT2LMHeadModel.activation_checkpointing_enable(use_reentrant=False)" in change.text
    assert model.is_activation_checkpointing
    losses = []
    for m in (plain, model):
        torch.manual_seed(2)
        out = m(input_ids=ids, labels=ids)
        out.loss.backward()
        losses.append(float(out.loss.detach()))
    (_, predicted) = [c for _, c in call.changes]
    assert "transformer.h.0 saves" in predicted.text and "one of 4" in predicted.text
    assert _predicted_mib(predicted.text) == pytest.approx(whole, rel=0.02, abs=0.05)
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    for a, b in zip(plain.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)


def test_the_optimize_page_shows_each_arms_peak_and_the_memory_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stored memory-goal result: the candidates' table has the peak beside the time,
    and the answer is the memory goal's."""
    from dashboard_helpers import open_page, stored_experiment  # local: Streamlit

    home = tmp_path / "home"
    ids = stored_experiment(home)
    with RunStore(home) as store:
        result = store.experiment(ids["experiment"])["result"]
        for c in result["candidates"]:
            c["trade"] = "peak 0.41x, 1.27x slower per sample" if c["name"] != "all" else None
        _, answer = memory_best([_outcome("prefetch_factor", 0.41, 1 / 1.27)], 1.5)
        result["best"] = {**result["best"], "fixes": ["prefetch_factor"], "goal": "memory"}
        result["best"]["answer"] = answer
        store.update_experiment(ids["experiment"], result=result)
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    at = open_page("optimize", experiment=str(ids["experiment"]))
    assert not at.exception, [e.value for e in at.exception]
    ablation = next(t.value for t in at.dataframe if "candidate" in t.value.columns)
    ablation = ablation.set_index("candidate")
    assert ablation.loc["prefetch_factor", "peak memory"] == "peak 0.41x, 1.27x slower per sample"
    assert ablation.loc["all", "peak memory"] == "—"
    assert [s.value for s in at.success] == [f"Goal memory: {answer}"]
