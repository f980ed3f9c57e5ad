"""The inference findings on real recorded jobs, and the inference fixes inside the job.

Each job is ``tests/jobs/infer_habits.py`` (a DataLoader over a small Linear/Dropout/LSTM
classifier, its habits chosen by flags) or an example, run under the bootstrap; the
diagnosis reads what its step timer recorded (``facts["forward"]``: how each forward
step ran). The fixes are checked on the job's own objects (its PROBE line) and on what
the run reported as applied (``config["applied"]``, verified by reading back).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from stepscope import fixes as catalog
from stepscope.analyzers.rules.diagnosis import diagnose_run
from stepscope.analyzers.rules.evidence import Evidence
from stepscope.analyzers.rules.inference import inference_grad, inference_train_mode
from stepscope.collectors.launch.contract import ENV_PLAN
from stepscope.store import RunStore
from stepscope.types import JobContext

_spec = importlib.util.spec_from_file_location(
    "stepscope_test_jobs_util", Path(__file__).parent / "jobs" / "util.py"
)
jobs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(jobs)

REPO = Path(__file__).resolve().parents[1]


def record(tmp_path: Path, *args: str, plan: dict | None = None, script: str = "infer_habits.py"):
    """Run a job under the bootstrap; (its PROBE dict or None, the run row, the diagnosis)."""
    extra_env = dict(jobs.torch_threads_env())
    if plan is not None:
        path = tmp_path / f"plan{len(list(tmp_path.glob('plan*.json')))}.json"
        path.write_text(json.dumps({"fixes": plan, "seed": 0}))
        extra_env[ENV_PLAN] = str(path)
    run_id, proc = jobs.run_job(tmp_path, script, *args, extra_env=extra_env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    probe = next((ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE ")), None)
    with RunStore(tmp_path) as store:
        run = store.run(run_id)
        diagnosis = diagnose_run(store, run_id, save=False)
    return (json.loads(probe[6:]) if probe else None), run, diagnosis


def keys(diagnosis) -> list[str]:
    return [f.key for f in diagnosis.findings]


def applied(run: dict, fix: str) -> list[dict]:
    return [e for e in run["config"].get("applied", []) if e["fix"] == fix]


# -- findings --------------------------------------------------------------------------------


def test_forgotten_inference_mode_is_the_first_finding(tmp_path: Path) -> None:
    _, run, diagnosis = record(tmp_path, "--grad")
    assert run["facts"]["forward"] == {
        "steps": 12,
        "grad_steps": 12,
        "train_mode_steps": 0,
        "backward": False,
    }
    first = diagnosis.findings[0]
    assert first.key == "compute/inference_grad", keys(diagnosis)
    assert first.phase == "forward"
    assert first.evidence[0].value == 1.0 and first.evidence[0].text.startswith("12 of 12")
    fix = first.fixes[0]
    assert fix.id == "inference_mode" and fix.auto and not fix.needs_consent
    assert "compute/inference_train_mode" not in keys(diagnosis)  # eval() was called


def test_the_forgotten_inference_mode_example_gets_that_finding_first(tmp_path: Path) -> None:
    script = str(REPO / "examples" / "inference_no_inference_mode.py")
    _, run, diagnosis = record(tmp_path, "--steps", "8", "--layers", "2", script=script)
    assert run["facts"]["forward"]["grad_steps"] == 8
    first = diagnosis.findings[0]
    assert first.key == "compute/inference_grad", keys(diagnosis)
    assert first.fixes[0].id == "inference_mode"
    assert first.fixes[0].typical_source.startswith("PyTorch blog 'A BetterTransformer")


def test_training_mode_with_dropout_is_a_warning_that_needs_consent(tmp_path: Path) -> None:
    _, run, diagnosis = record(tmp_path, "--train-mode")
    assert run["facts"]["forward"]["train_mode_steps"] == 12
    assert run["facts"]["model"]["mode_dependent"] == ["Dropout"]
    found = {f.key: f for f in diagnosis.findings}
    warning = found["compute/inference_train_mode"]
    assert "Dropout" in warning.title
    assert warning.cost == 0  # a warning about results: ranked after what costs time
    assert [f.id for f in warning.fixes] == ["eval_mode"]
    assert warning.fixes[0].needs_consent and warning.fixes[0].changes_numerics
    assert "compute/inference_grad" not in found  # under no_grad


def test_a_batch_of_one_recommends_a_larger_batch_and_the_sweep(tmp_path: Path) -> None:
    _, _, diagnosis = record(tmp_path, "--batch-size", "1", "--calls", "20")
    found = {f.key: f for f in diagnosis.findings}
    small = found["compute/small_batch"]
    assert small.evidence[0].value == 1.0
    assert any("--sweep batch" in e.text for e in small.evidence)
    assert [f.id for f in small.fixes] == ["larger_batch"]


def test_inference_loop_example_has_neither_warning(tmp_path: Path) -> None:
    """examples/inference_loop.py: eval() and inference_mode, as it should be written."""
    run_id, proc = jobs.run_job(
        tmp_path,
        str(REPO / "examples" / "inference_loop.py"),
        "--steps",
        "6",
        "--batch-size",
        "16",
        extra_env=jobs.torch_threads_env(),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with RunStore(tmp_path) as store:
        facts = store.run(run_id)["facts"]
        diagnosis = diagnose_run(store, run_id, save=False)
    assert facts["forward"]["grad_steps"] == 0 and facts["forward"]["train_mode_steps"] == 0
    assert facts["model"]["mode_dependent"] == ["BatchNorm2d"]
    assert not {"compute/inference_grad", "compute/inference_train_mode"} & set(keys(diagnosis))


def test_a_job_that_updates_by_hand_is_not_inference() -> None:
    """Forward under grad with a backward after it is training (rnn_manual_sgd's kind)."""
    facts = {
        "forward": {"steps": 10, "grad_steps": 10, "train_mode_steps": 10, "backward": True},
        "model": {"class": "RNN", "mode_dependent": ["Dropout"]},
    }
    ev = Evidence(level="steps", context=JobContext(facts=facts), steps={})
    assert inference_grad(ev) is None and inference_train_mode(ev) is None


# -- fixes in the job ------------------------------------------------------------------------


def test_inference_mode_fix_stops_autograd_recording(tmp_path: Path) -> None:
    base, _, _ = record(tmp_path, "--grad")
    probe, run, _ = record(tmp_path, "--grad", plan={"inference_mode": {}})
    assert base["requires_grad"] and not base["inference_tensor"]
    assert probe["inference_tensor"] and not probe["requires_grad"]
    (entry,) = applied(run, "inference_mode")
    assert entry["applied"] and entry["verified"], entry
    # the step timer saw it: only the first call (under way when the hooks came) recorded
    assert run["facts"]["forward"]["grad_steps"] == 1
    assert probe["last_output"] == pytest.approx(base["last_output"], rel=1e-5, abs=1e-6)


def test_eval_mode_fix_switches_dropout_off(tmp_path: Path) -> None:
    probe, run, _ = record(tmp_path, "--train-mode", plan={"eval_mode": {}})
    assert probe["training"] is False
    (entry,) = applied(run, "eval_mode")
    assert entry["applied"] and entry["verified"]
    assert entry["change"] == "Classifier.eval() (was in training mode)"
    assert run["facts"]["forward"]["train_mode_steps"] == 0  # from its first call
    # with dropout off the outputs are the eval-mode model's
    evaluated, _, _ = record(tmp_path)
    assert probe["first_output"] == pytest.approx(evaluated["first_output"], rel=1e-5, abs=1e-6)


def test_int8_dynamic_quant_replaces_linear_and_lstm(tmp_path: Path) -> None:
    base, _, _ = record(tmp_path)
    probe, run, _ = record(tmp_path, plan={"int8_dynamic_quant": {}})
    quantized = {name for name in probe["layers"] if ".quantized.dynamic." in name}
    assert {name.rsplit(".", 1)[1] for name in quantized} >= {"Linear", "LSTM"}
    assert "torch.nn.modules.linear.Linear" not in probe["layers"]  # every one replaced
    (entry,) = applied(run, "int8_dynamic_quant")
    assert entry["applied"] and entry["verified"]
    assert entry["change"].startswith("3 Linear/LSTM layers of Classifier quantised to int8")
    # 8-bit weights: close to the float outputs, not equal
    assert probe["first_output"] == pytest.approx(base["first_output"], abs=0.05)
    assert probe["first_output"] != base["first_output"]
    # the quantisation's observer calls were not taken for the job's steps
    assert run["facts"]["forward"]["steps"] == 12
    assert run["facts"]["model"]["class"] == "Classifier"


def test_bf16_autocast_and_channels_last_apply_without_an_optimizer(tmp_path: Path) -> None:
    _, run, _ = record(tmp_path, plan={"bf16_autocast": {"cpu": True}})
    (entry,) = applied(run, "bf16_autocast")
    assert entry["applied"] and entry["verified"], entry
    path = tmp_path / "cl.json"
    path.write_text(json.dumps({"fixes": {"channels_last": {}}, "seed": 0}))
    run_id, proc = jobs.run_job(
        tmp_path,
        str(REPO / "examples" / "inference_loop.py"),
        "--steps",
        "3",
        "--batch-size",
        "8",
        extra_env={**jobs.torch_threads_env(), ENV_PLAN: str(path)},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with RunStore(tmp_path) as store:
        (entry,) = applied(store.run(run_id), "channels_last")
    assert entry["applied"] and entry["verified"], entry


def test_int8_is_offered_for_cpu_inference_only() -> None:
    fix = catalog.get("int8_dynamic_quant")
    inference = {"forward": {"steps": 3, "backward": False}, "model": {"quantizable": ["LSTM"]}}
    ctx = JobContext(cuda=False, training=False, facts=inference)
    assert fix.requirement_status(ctx) == ([], [])
    assert "inference" in fix.requirement_status(JobContext(cuda=False, training=True))[0]
    assert "cpu_only" in fix.requirement_status(JobContext(cuda=True, training=False))[0]
    assert fix.needs_consent


def test_torch_compile_uses_cuda_graphs_for_cuda_inference_only() -> None:
    """``mode="reduce-overhead"`` (CUDA graphs) for a CUDA job with no optimizer and no
    backward; the default mode for training or the CPU."""
    fix = catalog.get("torch_compile")

    def facts(device: str, optimizer: bool, backward: bool = False) -> SimpleNamespace:
        run = {
            "facts": {
                "model": {"device": device},
                "forward": {"steps": 5, "backward": backward},
                **({"optimizer": {"class": "SGD"}} if optimizer else {}),
            }
        }
        return SimpleNamespace(run=run)  # what the plan's context offers the fix

    assert fix.params_for(facts("cuda:0", False), None)[0] == {"mode": "reduce-overhead"}
    assert fix.params_for(facts("cuda:0", True), None)[0] == {}
    assert fix.params_for(facts("cuda:0", False, backward=True), None)[0] == {}
    assert fix.params_for(facts("cpu", False), None)[0] == {}
