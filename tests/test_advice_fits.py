"""Advice that fits the job (issue 27, part 3): each fix's cited figure and snippet fit
the run's device and kind, a fix that acts on one phase is bounded by that phase's
share, and findings name only the phases the run has.

Unit level: the facts, evidence and findings are built here, as the diagnosis would
build them from a run; ``recommend`` and the rules are called on them directly.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from stepscope import fixes as catalog
from stepscope.analyzers.rules.compute import device_compute
from stepscope.analyzers.rules.evidence import Evidence
from stepscope.analyzers.rules.readings import has_backward, model_phase
from stepscope.analyzers.rules.recommend import recommend
from stepscope.fixes.catalog.fused_optimizer import REMOVES_OF_OPTIMIZER_PHASE
from stepscope.types import Finding, FixAdvice, JobContext, phase_label

# Words that only a GPU's figure uses: none may be cited to a job without CUDA.
GPU_WORDS = ("Tensor Core", "A100", "V100", "H100", "H200", "Volta", "Ampere", "GPU")
OPTIMIZER = {
    "class": "AdamW",
    "supports_fused": True,
    "fused": False,
    "foreach": None,
    "fused_kernels": ["cpu", "cuda"],
}
TRAINING_FACTS = {"optimizer": OPTIMIZER, "settings": {"cpu_bf16": True}}
INFERENCE_FACTS = {
    "forward": {"steps": 12, "grad_steps": 0, "train_mode_steps": 0, "backward": False},
    "settings": {"cpu_bf16": True},
    "model": {"quantizable": ["Linear"]},
}


def context(cuda: bool | None, training: bool) -> JobContext:
    """A job with everything the compute fixes ask for (convolutions, a DataLoader,
    native bf16 on its CPU, an Ampere GPU where it has CUDA)."""
    return JobContext(
        cuda=cuda,
        vendor="nvidia" if cuda else None,
        capability=8.0 if cuda else None,
        training=training,
        dataloader=True,
        conv2d=True,
        cpu_count=4,
        facts=TRAINING_FACTS if training else INFERENCE_FACTS,
    )


def steps(optimizer: float = 0.0, backward: float = 0.3, data: float = 0.02) -> dict:
    """The step timer's summary: its phases' shares (what ``step_stats.phases`` holds)."""
    forward = 1.0 - optimizer - backward - data - 0.02
    shares = {
        "data_wait": data,
        "forward": forward,
        "backward": backward,
        "optimizer": optimizer,
        "other": 0.02,
    }
    summary = {"data_wait_share": data, "phases": {k: {"share": v} for k, v in shares.items()}}
    if backward == 0 and optimizer == 0:
        summary["latency"] = {"count": 12, "p50_s": 0.01}  # an inference run's figures
    return summary


def advised(ctx: JobContext, key: str, share: float = 0.6, **kw) -> list[FixAdvice]:
    """The fixes ``recommend`` gives one finding of ``key`` on this job."""
    klass, subtype = key.split("/")
    finding = Finding(klass, subtype, key, share, 0.8, [], phase=kw.pop("phase", None))
    backward = 0.3 if ctx.training else 0.0
    ev = Evidence(level="steps", context=ctx, steps=kw.pop("steps", steps(backward=backward)))
    recommend(finding, ev)
    return finding.fixes


KEYS = sorted({key for fix in catalog.FIXES.values() for key in fix.addresses})


# -- 1. the device: no GPU's figure for a CPU job ------------------------------------------
@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
def test_a_cpu_job_is_cited_no_gpu_figure(training: bool) -> None:
    seen = set()
    for key in KEYS:
        for fix in advised(context(False, training), key):
            seen.add(fix.id)
            cited = f"{fix.typical_source or ''} {fix.basis}"
            assert not any(w in cited for w in GPU_WORDS), (key, fix.id, cited)
    assert "bf16_autocast" in seen and "torch_compile" in seen and "channels_last" in seen


def test_bf16_on_a_cpu_gets_no_tensor_core_figure_and_keeps_it_on_cuda() -> None:
    (cpu,) = [
        f
        for f in advised(context(False, True), "compute/device_compute")
        if f.id == "bf16_autocast"
    ]
    assert cpu.typical is None and cpu.typical_source is None and cpu.predicted_speedup is None
    assert cpu.basis.startswith("no cited figure fits a CPU training job")
    (gpu,) = [
        f for f in advised(context(True, True), "compute/device_compute") if f.id == "bf16_autocast"
    ]
    assert "Tensor Core" in gpu.typical_source and gpu.typical == (1.4, 2.0)
    assert gpu.predicted_speedup == pytest.approx(1 / (0.4 + 0.6 / 2.0), abs=0.01)


def test_a_job_of_unknown_device_gets_no_gpu_figure() -> None:
    ctx = JobContext(training=True, conv2d=True)  # a run that never said its device
    for fix in advised(ctx, "compute/device_compute"):
        assert not any(w in (fix.typical_source or "") for w in GPU_WORDS), fix.id


def test_static_cache_compile_cites_each_device_its_own_figure() -> None:
    fix = catalog.get("static_cache_compile")
    cpu = fix.fitting(JobContext(cuda=False, training=False)).typical
    gpu = fix.fitting(JobContext(cuda=True, training=False)).typical
    assert cpu.hi == 1.7 and "CPU" in cpu.source and "GPU" not in cpu.source
    assert gpu.hi == 4.0 and "GPU" in gpu.source


# -- 2. the kind: inference snippets and sources for an inference job ----------------------
@pytest.mark.parametrize("cuda", [True, False], ids=["cuda", "cpu"])
def test_an_inference_job_gets_no_backward_optimizer_or_training_figure(cuda: bool) -> None:
    seen = set()
    for key in KEYS:
        for fix in advised(context(cuda, False), key):
            seen.add(fix.id)
            for word in ("backward", "optimizer", "loss"):
                assert word not in fix.snippet, (key, fix.id, fix.snippet)
            assert "training" not in (fix.typical_source or ""), (key, fix.id)
            assert "optimizer" not in fix.title.lower() and "gradient" not in fix.title.lower()
    assert {"bf16_autocast", "torch_compile", "larger_batch"} <= seen
    assert not seen & {"fused_optimizer", "fp16_grad_scaler", "activation_checkpointing"}


def test_inference_snippets_run_the_forward_under_inference_mode() -> None:
    fixes = {f.id: f for f in advised(context(True, False), "compute/device_compute")}
    assert fixes["bf16_autocast"].snippet.startswith("with torch.inference_mode(), torch.autocast(")
    compile_ = fixes["torch_compile"]
    assert "inference" in compile_.typical_source and compile_.typical == (1.1, 2.27)


def test_a_training_job_keeps_its_training_snippet_and_figure() -> None:
    fixes = {f.id: f for f in advised(context(True, True), "compute/device_compute")}
    assert "loss.backward()" in fixes["bf16_autocast"].snippet
    assert "training speed-up" in fixes["torch_compile"].typical_source


# -- 3. a fix acting on one phase is bounded by that phase's share -------------------------
def fused(ctx: JobContext, key: str, share: float, **kw) -> FixAdvice:
    return next(f for f in advised(ctx, key, share, **kw) if f.id == "fused_optimizer")


def test_fused_optimizer_is_bounded_by_the_optimizer_phase() -> None:
    """The imagenet page: a compute finding of the whole step, an optimizer step of 0.8 %."""
    ctx = context(False, True)
    fix = fused(ctx, "compute/device_compute", 1.0, phase="forward+backward", steps=steps(0.008))
    assert fix.predicted_speedup == pytest.approx(1 / (1 - 0.5 * 0.008), abs=0.005)
    assert fix.basis == "Amdahl: removes up to 50 % of the optimizer step's 0.8 %"
    # a finding with no phase of its own (host overhead) is bounded the same way
    fix = fused(ctx, "compute/host_overhead", 0.7, steps=steps(0.05))
    assert "optimizer step's 5.0 %" in fix.basis


def test_the_optimizer_finding_keeps_its_own_share() -> None:
    ctx = context(False, True)
    fix = fused(ctx, "compute/optimizer_step", 0.3, phase="optimizer", steps=steps(0.3))
    removes = REMOVES_OF_OPTIMIZER_PHASE
    assert fix.predicted_speedup == pytest.approx(1 / (1 - removes * 0.3), abs=0.01)
    assert "removes up to 90 % of the 30 % share" in fix.basis


def test_no_bound_from_a_gpus_host_phases_and_no_fix_for_a_phase_of_none() -> None:
    # on CUDA the step timer's phases are host launches: no bound from them
    fix = fused(
        context(True, True),
        "compute/device_compute",
        1.0,
        phase="forward+backward",
        steps=steps(0.008),
    )
    assert "optimizer step" not in fix.basis
    # an optimizer step of none: nothing for the fused step to remove
    fixes = advised(
        context(False, True),
        "compute/device_compute",
        1.0,
        phase="forward+backward",
        steps=steps(0.0),
    )
    assert "fused_optimizer" not in {f.id for f in fixes}


def test_compilation_on_host_overhead_is_bounded_by_the_traces_forward_and_backward() -> None:
    """On a GPU the trace's phases (the device's view) bound it; the host overhead's share
    holds the loop's own Python too, which compiling the model does not touch."""
    trace = SimpleNamespace(
        phase_shares={"forward": 0.4, "backward": 0.26, "optimizer": 0.2, "other": 0.14},
        syncs=None,
    )
    finding = Finding("compute", "host_overhead", "host", 0.95, 0.8, [])
    recommend(finding, Evidence(level="trace", context=context(True, True), trace=trace))
    fix = next(f for f in finding.fixes if f.id == "torch_compile")
    assert (
        fix.basis == "Amdahl: the forward and backward's 66 % of the step sped up by at most 1.4x"
    )
    assert fix.predicted_speedup == pytest.approx(1 / (0.34 + 0.66 / 1.4), abs=0.01)


# -- 4. findings name only the phases the run has --------------------------------------------
def test_an_inference_finding_names_no_backward() -> None:
    ctx = JobContext(cuda=False, training=None)  # the device's facts alone cannot tell
    ev = Evidence(level="steps", context=ctx, steps=steps(0.0, 0.0, 0.05))
    finding = device_compute(ev)
    assert finding.phase == "forward"
    assert "backward" not in phase_label(finding.phase)
    assert all("backward" not in e.text for e in finding.evidence)


def test_model_phase_follows_the_runs_own_phases() -> None:
    def ev(training: bool | None, **kw) -> Evidence:
        return Evidence(level="steps", context=JobContext(training=training), **kw)

    assert model_phase(ev(True, steps=steps(0.1))) == "forward+backward"
    assert model_phase(ev(None, steps=steps(0.1))) == "forward+backward"  # measured
    assert model_phase(ev(True, steps=steps(0.0, 0.0))) == "forward"  # forward steps only
    assert model_phase(ev(None, generation={"requests": 3})) == "forward"  # requests
    assert model_phase(ev(False)) == "forward"
    assert has_backward(ev(None)) is None and model_phase(ev(None)) is None  # unknown: none named
