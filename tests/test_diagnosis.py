"""Diagnosis: each rule on both sides of its threshold, the fixes it recommends (and
refuses), the verdicts on the real traces, and a samples-only verdict on a process
that was never started under stepscope."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from recordings import pause_40
from traces import trace_path

from stepscope import fixes as catalog
from stepscope.analyzers.report.trace_report import TraceReport, analyze_trace
from stepscope.analyzers.rules import diagnosis as dx
from stepscope.analyzers.rules import thresholds as th
from stepscope.analyzers.rules.communication import collectives, host_device
from stepscope.analyzers.rules.compute import device_compute, host_overhead
from stepscope.analyzers.rules.diagnosis import diagnose, diagnose_report, diagnose_run
from stepscope.analyzers.rules.evidence import (
    Evidence,
    gather,
    system_summary,
    training_from_stacks,
)
from stepscope.analyzers.rules.io import input_pipeline, storage, waiting_process
from stepscope.analyzers.rules.memory import memory_bandwidth, memory_capacity
from stepscope.analyzers.rules.recommend import predict
from stepscope.analyzers.trace.load import load_trace
from stepscope.analyzers.trace.syncs import host_device_syncs
from stepscope.collectors.launch.launcher import launch_run
from stepscope.collectors.samplers.system_sampler import run_sampler
from stepscope.fixes.requirements import REQUIREMENTS
from stepscope.optim_runner.trials.plan import choose_fixes
from stepscope.store import RunStore
from stepscope.types import Finding, FixAdvice, JobContext

CPU_JOB = JobContext(cuda=False, training=True, dataloader=True, cpu_count=2)
A100_JOB = JobContext(
    cuda=True, vendor="nvidia", capability=8.0, training=True, dataloader=True, conv2d=True
)


def report(
    *,
    breakdown: dict[str, float],
    device: bool = True,
    gpu_util: float | None = None,
    tensor_cores: float = 0.0,
    kernels: dict[str, float] | None = None,
    ops: dict[str, float] | None = None,
    comm: dict | None = None,
    memory: dict | None = None,
    syncs: pd.DataFrame | None = None,
) -> TraceReport:
    """A TraceReport with the given figures; one step of 100 ms."""
    step_ns = 100e6
    kc = pd.DataFrame(
        [
            {"class": c, "count": 10, "total_ns": share * step_ns, "share": 0.0}
            for c, share in (kernels or {}).items()
        ],
        columns=["class", "count", "total_ns", "share"],
    )
    if len(kc):
        kc["share"] = kc["total_ns"] / kc["total_ns"].sum()
    gpu = pd.DataFrame(
        [{"rank": 0, "gpu_utilization": gpu_util, "tensor_core_share_modern": tensor_cores}]
        if device
        else []
    )
    ops_top = pd.DataFrame(
        [{"name": n, "count": 10, "self_ns": v * step_ns} for n, v in (ops or {}).items()],
        columns=["name", "count", "self_ns"],
    )
    summary = {
        "has_device": device,
        "steps": 1,
        "step_numbers": [1],
        "ranks": [0],
        "mean_step_ns": step_ns,
        "devices": {},
        "device_properties": [],
    }
    return TraceReport(
        paths=[],
        summary=summary,
        per_step=pd.DataFrame(),
        breakdown_avg=pd.DataFrame(),
        breakdown=breakdown,
        gpu=gpu,
        kernels_top=pd.DataFrame(),
        kernel_classes=kc,
        ops_top=ops_top,
        idle_time=None,
        syncs=syncs,
        temporal=None,
        communication=comm,
        memory=memory,
    )


def evidence(ctx: JobContext = CPU_JOB, **kw) -> Evidence:
    level = "trace" if kw.get("trace") is not None else "steps" if kw.get("steps") else "samples"
    return Evidence(level=level, context=ctx, **kw)


# -- rules on both sides of their thresholds ------------------------------------------
@pytest.mark.parametrize(
    ("share", "found"), [(th.INPUT_MIN - 0.001, False), (th.INPUT_MIN + 0.001, True)]
)
def test_input_pipeline_threshold(share: float, found: bool) -> None:
    f = input_pipeline(evidence(steps={"data_wait_share": share}))
    assert (f is not None) is found
    if found:
        assert f.confidence < 0.9  # moderately input-bound
    high = input_pipeline(evidence(steps={"data_wait_share": th.INPUT_HIGH + 0.01}))
    assert high.confidence == 0.9 and "highly" in high.title


@pytest.mark.parametrize(
    ("iowait", "found"), [(th.IOWAIT_HIGH - 1, False), (th.IOWAIT_HIGH + 1, True)]
)
def test_storage_threshold(iowait: float, found: bool) -> None:
    ev = evidence(steps={"data_wait_share": 0.4}, system={"system.iowait_percent.mean": iowait})
    assert (storage(ev) is not None) is found
    # a busy disk that the loop does not wait for is someone else's problem
    ev = evidence(steps={"data_wait_share": 0.01}, system={"system.iowait_percent.mean": 50.0})
    assert storage(ev) is None


@pytest.mark.parametrize(
    ("util", "found"), [(th.GPU_UTIL_LOW + 0.01, False), (th.GPU_UTIL_LOW - 0.01, True)]
)
def test_host_overhead_gpu_threshold(util: float, found: bool) -> None:
    r = report(
        breakdown={"Kernel": util, "CPU Exec": 1 - util}, gpu_util=util, kernels={"gemm_conv": util}
    )
    f = host_overhead(evidence(A100_JOB, trace=r))
    assert (f is not None) is found
    if found:
        assert f.share == pytest.approx(1 - util)


@pytest.mark.parametrize(("framework", "found"), [(0.05, False), (0.5, True)])
def test_host_overhead_cpu_threshold(framework: float, found: bool) -> None:
    r = report(
        breakdown={"CPU Exec": 0.98, "Other": 0.02},
        device=False,
        ops={"aten::view": framework, "aten::addmm": 1 - framework},
    )
    f = host_overhead(evidence(trace=r))
    assert (f is not None) is found


@pytest.mark.parametrize(
    ("gemm", "found"), [(th.KERNEL_MIN - 0.01, False), (th.KERNEL_MIN + 0.01, True)]
)
def test_device_compute_threshold(gemm: float, found: bool) -> None:
    r = report(
        breakdown={"Kernel": 0.9, "CPU Exec": 0.1},
        gpu_util=0.9,
        kernels={"gemm_conv": gemm, "elementwise": 0.9 - gemm},
    )
    f = device_compute(evidence(A100_JOB, trace=r))
    assert (f is not None) is found


@pytest.mark.parametrize(("tc", "unused"), [(th.TENSOR_CORE_MIN + 0.01, False), (0.0, True)])
def test_tensor_cores_unused(tc: float, unused: bool) -> None:
    r = report(breakdown={"Kernel": 0.9}, gpu_util=0.9, tensor_cores=tc, kernels={"gemm_conv": 0.8})
    f = device_compute(evidence(A100_JOB, trace=r))
    assert ("without Tensor Cores" in f.title) is unused


@pytest.mark.parametrize(("pointwise", "found"), [(0.05, False), (0.6, True)])
def test_memory_bandwidth_threshold(pointwise: float, found: bool) -> None:
    r = report(
        breakdown={"CPU Exec": 1.0},
        device=False,
        ops={"aten::mul": pointwise, "aten::mm": 1 - pointwise},
    )
    assert (memory_bandwidth(evidence(trace=r)) is not None) is found


@pytest.mark.parametrize(
    ("peak", "found"), [(th.CAPACITY_HIGH - 0.01, False), (th.CAPACITY_HIGH + 0.01, True)]
)
def test_memory_capacity_threshold(peak: float, found: bool) -> None:
    r = report(
        breakdown={"Kernel": 0.9},
        gpu_util=0.9,
        memory={
            "cuda:0": {"peak_share": peak, "peak_allocated_bytes": 1, "peak_reserved_bytes": 1}
        },
    )
    assert (memory_capacity(evidence(A100_JOB, trace=r)) is not None) is found


def test_an_oom_is_a_capacity_finding_first() -> None:
    ev = evidence(
        A100_JOB,
        steps={"data_wait_share": 0.3},
        run={"error": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB"},
    )
    d = diagnose(ev)
    assert (d.findings[0].klass, d.findings[0].subtype) == ("memory", "capacity")
    assert "expandable_segments" in {f.id for f in d.findings[0].fixes}


@pytest.mark.parametrize(
    ("share", "found"), [(th.COMM_MIN - 0.001, False), (th.COMM_MIN + 0.001, True)]
)
def test_collectives_threshold(share: float, found: bool) -> None:
    r = report(
        breakdown={"Communication": share, "Kernel": 0.5},
        gpu_util=0.5,
        comm={"share": share, "overlap": 0.2},
    )
    assert (collectives(evidence(A100_JOB, trace=r)) is not None) is found


def test_host_device_counts_syncs_only_when_the_gpu_starves() -> None:
    syncs = pd.DataFrame(
        [{"call": "cudaStreamSynchronize", "op": "aten::item", "count": 50, "total_ns": 20e6}]
    )
    idle = report(breakdown={"Kernel": 0.3, "CPU Exec": 0.7}, gpu_util=0.3, syncs=syncs)
    f = host_device(evidence(A100_JOB, trace=idle))
    assert f is not None and f.share == pytest.approx(0.2)
    assert any("aten::item" in e.text for e in f.evidence)
    busy = report(breakdown={"Kernel": 0.95, "CPU Exec": 0.05}, gpu_util=0.95, syncs=syncs)
    assert host_device(evidence(A100_JOB, trace=busy)) is None


@pytest.mark.parametrize(
    ("cpu", "found"), [(th.WAITING_CPU_PERCENT + 5, False), (th.WAITING_CPU_PERCENT - 5, True)]
)
def test_waiting_process_threshold(cpu: float, found: bool) -> None:
    ev = evidence(system={"proc.cpu_percent.mean": cpu})
    assert (waiting_process(ev) is not None) is found


# -- recommendations -------------------------------------------------------------------
def _fix_ids(ev: Evidence, subtype: str) -> tuple[set[str], dict[str, str]]:
    f = next(f for f in diagnose(ev).findings if f.subtype == subtype)
    return {x.id for x in f.fixes}, {s.id: s.reason for s in f.skipped}


def test_no_gpu_advice_for_a_cpu_job_and_no_tf32_before_ampere() -> None:
    r = report(breakdown={"Kernel": 0.9, "CPU Exec": 0.1}, gpu_util=0.9, kernels={"gemm_conv": 0.8})
    v100 = JobContext(cuda=True, vendor="nvidia", capability=7.0, training=True)
    ids, skipped = _fix_ids(evidence(v100, trace=r), "device_compute")
    assert "tf32" not in ids and "bf16_autocast" not in ids and "fp16_grad_scaler" in ids
    assert skipped["tf32"] == "needs tf32"
    ids, _ = _fix_ids(evidence(A100_JOB, trace=r), "device_compute")
    assert {"tf32", "bf16_autocast"} <= ids
    cpu = report(breakdown={"CPU Exec": 1.0}, device=False, ops={"aten::mm": 1.0})
    ids, skipped = _fix_ids(evidence(CPU_JOB, trace=cpu), "device_compute")
    assert not ids & {"tf32", "bf16_autocast", "cudnn_benchmark"}
    assert skipped["bf16_autocast"] == "needs fast_bf16"
    # a CPU that reported native bf16 (AVX512-BF16 / AMX) gets CPU autocast, no CUDA advice
    bf16_cpu = JobContext(cuda=False, training=True, facts={"settings": {"cpu_bf16": True}})
    ids, _ = _fix_ids(evidence(bf16_cpu, trace=cpu), "device_compute")
    assert "bf16_autocast" in ids and not ids & {"tf32", "cudnn_benchmark"}


def test_a_fix_in_effect_is_not_recommended_again() -> None:
    steps = {"data_wait_share": 0.5}
    none = JobContext(
        cuda=False,
        dataloader=True,
        cpu_count=2,
        facts={"dataloaders": [{"num_workers": 0, "prefetch_factor": None}]},
    )
    ids, _ = _fix_ids(evidence(none, steps=steps), "input_pipeline")
    assert "dataloader_workers" in ids
    many = JobContext(
        cuda=False,
        dataloader=True,
        cpu_count=2,
        facts={
            "dataloaders": [{"num_workers": 8, "persistent_workers": True, "prefetch_factor": 4}]
        },
    )
    ids, skipped = _fix_ids(evidence(many, steps=steps), "input_pipeline")
    assert not ids & {"dataloader_workers", "persistent_workers", "prefetch_factor"}
    assert skipped["dataloader_workers"] == "already in effect"
    r = report(breakdown={"Kernel": 0.9}, gpu_util=0.9, kernels={"gemm_conv": 0.8})
    tf32_on = JobContext(**{**A100_JOB.__dict__, "facts": {"settings": {"tf32_matmul": True}}})
    ids, skipped = _fix_ids(evidence(tf32_on, trace=r), "device_compute")
    assert "tf32" not in ids and skipped["tf32"] == "already in effect"


def test_predicted_gain_is_the_amdahl_bound() -> None:
    pred, basis = catalog.get("dataloader_workers"), None
    bound, basis = predict(pred, 0.30)
    assert bound == pytest.approx(1 / 0.7, abs=0.01) and "Amdahl" in basis
    amp, _ = predict(catalog.get("bf16_autocast"), 0.5)  # half the step, at most 2x faster
    assert amp == pytest.approx(1 / (0.5 + 0.25), abs=0.01)
    assert predict(catalog.get("expandable_segments"), None)[0] is None


def test_catalog_entries_are_complete() -> None:
    required = {
        "dataloader_workers",
        "pin_memory",
        "persistent_workers",
        "prefetch_factor",
        "non_blocking_copies",
        "bf16_autocast",
        "fp16_grad_scaler",
        "tf32",
        "cudnn_benchmark",
        "torch_compile",
        "channels_last",
        "fused_optimizer",
        "activation_checkpointing",
        "larger_batch",
        "expandable_segments",
        "avoid_syncs",
        "cpu_threads",
        "ddp_bucket_cap",
        "ddp_gradient_as_bucket_view",
        "ddp_static_graph",
        "ddp_bf16_compression",
        "dataparallel_to_ddp",
    }
    assert required <= set(catalog.FIXES)
    for fix in catalog.FIXES.values():
        assert fix.addresses and fix.snippet and fix.why
        assert set(fix.requires) <= set(REQUIREMENTS)
        if fix.typical is not None:
            assert fix.typical.lo < fix.typical.hi and fix.typical.source
    assert not catalog.get("fp16_grad_scaler").auto  # suggest only
    assert not catalog.get("avoid_syncs").auto
    assert catalog.get("bf16_autocast").changes_numerics
    assert not catalog.get("dataloader_workers").changes_numerics
    with pytest.raises(KeyError, match="known:"):
        catalog.get("nope")


# -- the real traces -----------------------------------------------------------------
def _diagnose_trace(*names: str) -> list[dict]:
    return diagnose_report(analyze_trace([trace_path(n) for n in names])).to_json()


def test_resnet_num_workers_0_is_input_bound_first() -> None:
    findings = _diagnose_trace("resnet50_v100_num_workers_0.pt.trace.json.gz")
    first = findings[0]
    assert (first["class"], first["subtype"]) == ("io", "input_pipeline")
    assert first["share"] == pytest.approx(0.334, abs=0.01)
    assert first["fixes"][0]["id"] == "dataloader_workers"
    # V100: no bf16 / TF32 advice anywhere, Tensor Cores unused is called out
    compute = next(f for f in findings if f["subtype"] == "device_compute")
    assert "without Tensor Cores" in compute["title"]
    assert not {x["id"] for f in findings for x in f["fixes"]} & {"tf32", "bf16_autocast"}


def test_resnet_num_workers_4_has_no_input_finding() -> None:
    findings = _diagnose_trace("resnet50_v100_num_workers_4.pt.trace.json.gz")
    assert all(f["subtype"] != "input_pipeline" for f in findings)
    assert findings[0]["class"] == "compute"


@pytest.mark.parametrize(
    "names",
    [
        ("a100_nccl_3steps.json.gz",),
        ("sampled_2ranks_rank-0.json.gz", "sampled_2ranks_rank-1.json.gz"),
    ],
)
def test_nccl_traces_get_a_communication_finding(names: tuple[str, ...]) -> None:
    findings = _diagnose_trace(*names)
    comm = next(f for f in findings if f["subtype"] == "collectives")
    assert comm["class"] == "communication" and comm["share"] > th.COMM_MIN
    assert any(e["text"].startswith("overlap with compute") for e in comm["evidence"])


def test_cpu_only_and_amd_traces_get_a_verdict() -> None:
    cpu = _diagnose_trace("cpu_only_rank34.pt.trace.json.gz")
    assert cpu and cpu[0]["class"] == "communication"
    assert not {x["id"] for f in cpu for x in f["fixes"]} & {"pin_memory", "bf16_autocast"}
    amd = _diagnose_trace("amd_mi250_minitoy.json.gz")
    assert amd[0]["subtype"] == "host_overhead"
    assert "tf32" not in {x["id"] for f in amd for x in f["fixes"]}


# -- samples only: a process stepscope did not start ------------------------------------
def _attach_samples(store: RunStore, command: list[str], seconds: float) -> int:
    """Start a plain process, sample it with the real system sampler, then stop it."""
    proc = subprocess.Popen(command)
    run_id = store.create_run(command, name="attached", pid=None)
    stop = threading.Event()
    sampler = threading.Thread(
        target=run_sampler,
        args=(str(store.home), run_id, proc.pid, 0.25),
        kwargs={"gpu": False, "stop": stop},
    )
    sampler.start()
    time.sleep(seconds)
    stop.set()
    sampler.join(10)
    proc.kill()
    proc.wait()
    store.finish_run(run_id, "stopped")
    return run_id


@pytest.mark.slow
def test_samples_only_verdicts_for_processes_started_without_stepscope(tmp_path: Path) -> None:
    with RunStore(tmp_path) as store:
        busy = _attach_samples(
            store,
            [sys.executable, "-c", "import torch\nx=torch.randn(800,800)\nwhile True: x@x"],
            4.0,
        )
        idle = _attach_samples(store, [sys.executable, "-c", "import time; time.sleep(60)"], 2.0)
        d_busy = diagnose_run(store, busy)
        d_idle = diagnose_run(store, idle)
        assert d_busy.level == d_idle.level == "samples"
        assert (d_busy.findings[0].klass, d_busy.findings[0].subtype) == (
            "compute",
            "device_compute",
        )
        assert d_idle.findings[0].klass == "io"
        assert store.findings(busy)[0].level == "samples"


def test_system_summary_pools_gpus() -> None:
    samples = pd.DataFrame(
        [
            (1.0, "gpu0", "util_percent", 10.0),
            (1.0, "gpu1", "util_percent", 30.0),
            (2.0, "proc", "cpu_percent", 50.0),
        ],
        columns=["t", "scope", "metric", "value"],
    )
    s = system_summary(samples)
    assert s["gpu.util_percent.mean"] == 20.0 and s["gpu1.util_percent.max"] == 30.0
    assert s["duration_s"] == 1.0


def test_syncs_are_attributed_to_the_operator_that_issued_them() -> None:
    syncs = host_device_syncs(
        load_trace(trace_path("resnet50_v100_num_workers_0.pt.trace.json.gz"))
    )
    rows = {(r.call, r.op): (r.count, r.total_ns) for r in syncs.itertuples()}
    assert rows[("cudaStreamSynchronize", "aten::copy_")] == (12, 551000)
    assert rows[("cudaDeviceSynchronize", "")][0] == 1  # outside any operator
    cpu = host_device_syncs(load_trace(trace_path("cpu_only_rank34.pt.trace.json.gz")))
    assert cpu.empty and list(cpu.columns) == ["call", "op", "count", "total_ns"]


# -- one long pause is not an input pipeline --------------------------------------------
JOBS = Path(__file__).resolve().parent / "jobs"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _launch(home: Path, *args: str, env: dict[str, str] | None = None) -> int:
    run_id, _ = launch_run([sys.executable, *args], home=home, quiet=True, extra_env=env)
    return run_id


def _texts(finding: Finding) -> list[str]:
    return [e.text for e in finding.evidence]


def test_one_pause_in_the_loader_is_not_an_input_bound_job(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # 40 steps of 10 ms; one sample sleeps 200 ms once: the ratio of sums said 31 %
    home, run_id = pause_40(tmp_path_factory, "pause")
    with RunStore(home) as store:
        d = diagnose_run(store, run_id)
    assert d.level == "steps"
    assert not [f for f in d.findings if f.subtype == "input_pipeline"]
    first = d.findings[0]
    assert first.subtype == "device_compute" and first.share > 1 - th.INPUT_MIN
    note = next(t for t in _texts(first) if "outlier" in t)
    assert note.startswith("1 step with a ") and "ms wait left out as an outlier" in note
    assert "median wait" in note


def test_a_loader_that_waits_on_every_step_stays_input_bound(tmp_path: Path) -> None:
    # the same job with every sample sleeping 5 ms: ~20 ms of wait in a ~30 ms step
    args = ("--steps", "30", "--pause-ms", "5", "--every")
    run_id = _launch(tmp_path, str(JOBS / "pause.py"), *args)
    with RunStore(tmp_path) as store:
        d = diagnose_run(store, run_id)
    first = d.findings[0]
    assert (first.subtype, first.confidence) == ("input_pipeline", round(0.9 * 0.85, 2))
    assert "highly" in first.title
    assert not [t for f in d.findings for t in _texts(f) if "outlier" in t]


def test_outlier_note_goes_with_the_input_finding() -> None:
    steps = {
        "data_wait_share": 0.08,
        "data_wait_share_raw": 0.46,
        "data_wait_outliers": {
            "count": 1,
            "steps": [7],
            "max_s": 0.196,
            "min_s": 0.196,
            "total_s": 0.196,
            "median_wait_s": 0.0004,
        },
    }
    f = input_pipeline(evidence(steps=steps))
    assert f.share == 0.08 and "moderately" in f.title
    assert "1 step with a 196 ms wait left out as an outlier; median wait 0.4 ms" in _texts(f)


# -- a run without steps has nothing to diagnose -----------------------------------------
NO_STEPS = "no steps recorded: the job ended before its first optimizer step / forward"


@pytest.mark.parametrize(
    ("code", "failed"),
    [("import torch", False), ("import torch\nraise RuntimeError('no data found')", True)],
)
def test_a_run_without_steps_has_nothing_to_diagnose(
    tmp_path: Path, code: str, failed: bool
) -> None:
    run_id = _launch(tmp_path, "-c", code)
    with RunStore(tmp_path) as store:
        assert store.steps(run_id).empty
        d = diagnose_run(store, run_id)
        assert store.findings(run_id) == []
    assert d.findings == [] and d.reason.startswith(NO_STEPS)
    assert d.reason in d.warnings
    assert ("RuntimeError: no data found" in d.reason) is failed


def test_analyze_prints_why_a_run_has_no_diagnosis(tmp_path: Path) -> None:
    run_id = _launch(tmp_path, "-c", "import torch")
    cli = [sys.executable, "-m", "stepscope.app.cli", "--home", str(tmp_path), "analyze"]
    text = subprocess.run([*cli, str(run_id)], capture_output=True, text=True, timeout=120)
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith(f"run {run_id}: nothing to diagnose: {NO_STEPS}")
    assert "Compute" not in text.stdout and "no bottleneck" not in text.stdout
    out = subprocess.run([*cli, str(run_id), "--json"], capture_output=True, text=True, timeout=120)
    data = json.loads(out.stdout)
    assert data["findings"] == [] and data["reason"].startswith(NO_STEPS)


def test_no_cuda_fix_for_a_job_that_did_not_report_cuda() -> None:
    unknown = JobContext(
        cuda=None, training=True, dataloader=True, conv2d=True, facts={"dataloaders": [{}]}
    )
    for steps, subtype in (
        ({"data_wait_share": 0.0}, "device_compute"),
        ({"data_wait_share": 0.5}, "input_pipeline"),
    ):
        ids, skipped = _fix_ids(evidence(unknown, steps=steps), subtype)
        cuda_only = {
            "tf32",
            "cudnn_benchmark",
            "pin_memory",
            "non_blocking_copies",
            "fp16_grad_scaler",
            "avoid_syncs",
            "expandable_segments",
        }
        assert not ids & cuda_only
        assert all("cuda" in skipped[i] for i in set(skipped) & cuda_only)
    # a job that reported CUDA still gets them
    ids, _ = _fix_ids(evidence(A100_JOB, steps={"data_wait_share": 0.0}), "device_compute")
    assert {"tf32", "cudnn_benchmark"} <= ids


def test_nvml_seeing_the_job_on_a_gpu_counts_as_cuda(tmp_path: Path) -> None:
    with RunStore(tmp_path) as store:
        run_id = store.create_run(["python", "attached.py"], name="attached")
        store.add_samples(run_id, [(1.0, "gpu0", "job_mem_used_bytes", 2e9)])
        assert gather(store, run_id).context.cuda is True
        other = store.create_run(["python", "cpu.py"], name="cpu")
        store.add_samples(other, [(1.0, "gpu0", "util_percent", 80.0)])  # someone else's
        assert gather(store, other).context.cuda is None


# -- cpu_threads only with evidence ----------------------------------------------------------
@pytest.fixture(scope="module")
def dense_runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """dense_compute with torch's default threads (one per core), and with 2 threads on
    the 1 core it may use: the launcher and the job both pinned to one core, as a CPU
    set or a scheduler would, while OMP_NUM_THREADS asks for 2."""
    if not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores and CPU affinity (Linux)")
    home = tmp_path_factory.mktemp("threads")
    args = (str(EXAMPLES / "dense_compute.py"), "--steps", "6", "--depth", "2")
    default = _launch(home, *args)
    one_core = min(os.sched_getaffinity(0))
    env = dict(os.environ, OMP_NUM_THREADS="2", STEPSCOPE_HOME=str(home))
    cli = [sys.executable, "-m", "stepscope.app.cli", "--home", str(home), "run", "--"]
    proc = subprocess.run(
        [*cli, sys.executable, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: os.sched_setaffinity(0, {one_core}),
    )
    assert proc.returncode == 0, proc.stderr
    with RunStore(home) as store:
        over = store.resolve_run("last")
    return {"home": home, "cores": len(os.sched_getaffinity(0)), "default": default, "over": over}


def _cpu_threads(home: Path, run_id: int) -> tuple[list[FixAdvice], list[str]]:
    with RunStore(home) as store:
        d = diagnose_run(store, run_id)
        threads = store.run(run_id)["device"]["threads"]
    fixes = [x for f in d.findings for x in f.fixes if x.id == "cpu_threads"]
    why = [s.reason for f in d.findings for s in f.skipped if s.id == "cpu_threads"]
    return fixes, why + [str(threads)]


def test_threads_equal_to_cores_get_no_thread_advice(dense_runs: dict) -> None:
    fixes, why = _cpu_threads(dense_runs["home"], dense_runs["default"])
    cores = dense_runs["cores"]
    assert why[-1] == str(cores)  # torch's default: one thread per core
    assert fixes == []
    assert (
        why[0]
        == f"no evidence the thread count is wrong: {cores} intra-op threads on {cores} cores"
    )


def test_oversubscribed_threads_get_one_per_core(dense_runs: dict) -> None:
    fixes, why = _cpu_threads(dense_runs["home"], dense_runs["over"])
    assert why[-1] == "2"  # torch honours OMP_NUM_THREADS beyond the job's one core
    assert fixes and all(f.params == {"threads": 1} for f in fixes)
    assert fixes[0].evidence.startswith("2 intra-op threads on 1 core the job may use")
    with RunStore(dense_runs["home"]) as store:
        planned = {p.id: p for p in choose_fixes(store, dense_runs["over"])}
        assert planned["cpu_threads"].params == {"threads": 1}
        assert "oversubscribed" in planned["cpu_threads"].why_params
        # and the job that already runs one thread per core is not offered it by default
        assert "cpu_threads" not in {p.id for p in choose_fixes(store, dense_runs["default"])}


def _thread_ids(ctx: JobContext, subtype: str, **kw) -> tuple[FixAdvice | None, str | None]:
    f = next(f for f in diagnose(evidence(ctx, **kw)).findings if f.subtype == subtype)
    fix = next((x for x in f.fixes if x.id == "cpu_threads"), None)
    reason = next((s.reason for s in f.skipped if s.id == "cpu_threads"), None)
    return fix, reason


def test_busy_workers_beside_intra_op_threads_get_the_cores_they_leave() -> None:
    ctx = JobContext(
        cuda=False,
        training=True,
        dataloader=True,
        cpu_count=4,
        facts={"dataloaders": [{"num_workers": 2}], "settings": {"threads": 4}},
    )
    busy = {
        "proc.cpu_percent.mean": 390.0,  # the main process and, beside it, ~2 cores of workers
        "proc.cpu_max_process_percent.mean": 190.0,
        "proc.children.mean": 2.0,
    }
    fix, _ = _thread_ids(ctx, "device_compute", steps={"data_wait_share": 0.0}, system=busy)
    assert fix.params == {"threads": 2}
    assert "2 CPU-busy DataLoader workers" in fix.evidence
    idle = dict(busy, **{"proc.cpu_percent.mean": 200.0})  # the workers sleep (I/O)
    fix, reason = _thread_ids(ctx, "device_compute", steps={"data_wait_share": 0.0}, system=idle)
    assert fix is None and reason.startswith("no evidence")


def test_tiny_ops_with_several_threads_get_one_thread() -> None:
    r = report(
        breakdown={"CPU Exec": 0.98, "Other": 0.02},
        device=False,
        ops={"aten::view": 0.5, "aten::addmm": 0.5},
    )
    two = JobContext(cuda=False, training=True, cpu_count=2, facts={"settings": {"threads": 2}})
    fix, _ = _thread_ids(two, "host_overhead", trace=r)
    assert fix.params == {"threads": 1} and "tiny" in fix.evidence
    one = JobContext(cuda=False, training=True, cpu_count=2, facts={"settings": {"threads": 1}})
    fix, reason = _thread_ids(one, "host_overhead", trace=r)
    assert fix is None and "1 intra-op thread" in reason


def test_a_verdict_from_very_few_steps_says_so() -> None:
    """A torchrun job that stepped once was "highly input-bound" from one 12 ms step."""
    one = {"data_wait_share": 0.38, "timed_steps": 1}
    d = dx.diagnose(evidence(steps=one))
    many = dx.diagnose(evidence(steps=dict(one, timed_steps=20)))
    assert d.findings[0].subtype == many.findings[0].subtype == "input_pipeline"
    assert d.findings[0].confidence == pytest.approx(many.findings[0].confidence * 0.5, abs=0.01)
    assert any("only 1 timed step" in w for w in d.warnings)
    assert not any("timed step" in w for w in many.warnings)


# -- a capture that covered no step of the job ------------------------------------------
def test_a_capture_after_the_last_step_gives_no_shares_of_step_time(tmp_path: Path) -> None:
    # LBFGS's 58 s steps: the capture held only "steps" of 5.6, 0.2, 0.1 ms after the
    # last real one, and the verdict was "host overhead, 100 % of step time". Here the
    # capture opens at step 4 of a 4-step job: it holds only the job's tail.
    home = tmp_path / "h"
    run_id, code = launch_run(
        [sys.executable, str(JOBS / "train.py"), "--steps", "4", "--sleep", "0.3"],
        home=home,
        quiet=True,
        profile_at=4,
        profile_steps=3,
    )
    assert code == 0
    with RunStore(home) as store:
        assert not store.steps(run_id)["profiled"].fillna(0).astype(bool).any()
        assert not store.artifacts(run_id).empty  # a trace was written: the job's tail
        diagnosis = diagnose_run(store, run_id)
    assert dx.NO_COMPLETE_STEP in diagnosis.warnings
    assert diagnosis.level != "trace"  # the shares come from the steps and samples
    assert all(f.key != "compute/host_overhead" for f in diagnosis.findings)


def test_a_capture_of_whole_steps_is_used(tmp_path: Path) -> None:
    home = tmp_path / "h"
    run_id, code = launch_run(
        [sys.executable, str(JOBS / "train.py"), "--steps", "5", "--sleep", "0.05"],
        home=home,
        quiet=True,
        profile_at=2,
        profile_steps=2,
    )
    assert code == 0
    with RunStore(home) as store:
        diagnosis = diagnose_run(store, run_id)
    assert dx.NO_COMPLETE_STEP not in diagnosis.warnings
    assert diagnosis.level == "trace"


@pytest.mark.parametrize(
    ("shares", "samples", "idle", "kind"),
    [
        ({"forward": 0.9, "elsewhere": 0.1}, 120, 0.5, False),  # a server's requests
        ({"forward": 0.5, "backward": 0.4, "optimizer": 0.1}, 120, 0.0, True),
        ({"forward": 0.9, "optimizer": 0.02}, 120, 0.0, True),  # one optimizer sample
        ({"forward": 1.0}, 30, 0.5, None),  # 15 busy samples: too few to say
        ({"elsewhere": 1.0}, 200, 0.0, None),  # no model work seen at all
    ],
)
def test_an_attach_from_outside_reads_the_jobs_kind_from_its_stacks(
    shares: dict, samples: int, idle: float, kind: bool | None
) -> None:
    stacks = {"shares": shares, "samples": samples, "idle_share": idle}
    assert training_from_stacks(stacks) is kind
