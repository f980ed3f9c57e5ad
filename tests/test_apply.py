"""Fixes applied inside a real job by the bootstrap, seen from the job's own objects.

Each test runs ``tests/jobs/apply_probe.py`` (no stepscope import) under the bootstrap
with a plan file, and reads back what the job's DataLoader, optimizer and model ended up
with, what the run recorded as applied, and whether the losses stayed the same where
the fix does not change numerics.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from stepscope.collectors.launch.contract import ENV_PLAN
from stepscope.store import RunStore

_spec = importlib.util.spec_from_file_location(
    "stepscope_test_jobs_util", Path(__file__).parent / "jobs" / "util.py"
)
jobs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(jobs)


def probe(tmp_path: Path, fixes: dict | None, *args: str, **plan_extra) -> tuple[dict, dict]:
    """Run the probe job with this plan (None: no plan); returns (probe output, run row)."""
    extra_env = {}
    if fixes is not None:
        plan = tmp_path / f"plan{len(list(tmp_path.glob('plan*.json')))}.json"
        plan.write_text(json.dumps({"fixes": fixes, "seed": 0, **plan_extra}))
        extra_env[ENV_PLAN] = str(plan)
    run_id, proc = jobs.run_job(tmp_path, "apply_probe.py", *args, extra_env=extra_env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE "))
    with RunStore(tmp_path) as store:
        run = store.run(run_id)
        run["events"] = store.events(run_id)
    return json.loads(line[6:]), run


def applied(run: dict) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for item in run["config"].get("applied", []):
        if item["applied"]:
            out.setdefault(item["fix"], []).append(item["change"])
    return out


def test_dataloader_and_optimizer_fixes_keep_the_losses(tmp_path: Path) -> None:
    base, _ = probe(tmp_path, None)
    assert base["num_workers"] == 0 and base["foreach"] is None
    fixed, run = probe(
        tmp_path,
        {
            "dataloader_workers": {"num_workers": 2},
            "persistent_workers": {},
            "prefetch_factor": {"prefetch_factor": 4},
            "fused_optimizer": {},
        },
    )
    assert fixed["num_workers"] == 2
    assert fixed["persistent_workers"] is True and fixed["prefetch_factor"] == 4
    # torch >= 2.4 has fused CPU kernels for SGD: fused, and the log says why
    assert fixed["fused"] is True and not fixed["foreach"]
    # none of these change numerics: the job's own losses are the same
    assert fixed["losses"] == pytest.approx(base["losses"], rel=1e-6)
    done = applied(run)
    assert done["dataloader_workers"] == ["num_workers 0 -> 2 (0 was torch's default)"]
    assert done["fused_optimizer"][0].startswith("SGD(fused=True; was torch's default; torch ")
    # each change was read back from the job's own objects
    assert all(i["verified"] for i in run["config"]["applied"] if i["applied"]), run["config"]
    assert (run["events"]["source"] == "apply").any()
    # the facts the diagnosis reads see the patched loader
    assert run["facts"]["dataloaders"][0]["num_workers"] == 2


def test_a_helper_process_that_imports_torch_keeps_the_jobs_changes(tmp_path: Path) -> None:
    """Inductor's compile workers are fresh Pythons with the job's environment: they
    install the plan too (its seeding), and their record must add to the job's, not
    replace it (on a GPU a static cache's change was lost so, and its arm refused)."""
    _, run = probe(tmp_path, {"fused_optimizer": {}}, "--steps", "2", "--helper")
    done = applied(run)
    assert done["fused_optimizer"][0].startswith("SGD(fused=True")
    # each process that imported torch seeded its RNGs, and says so
    assert done["seed"] == ["RNGs seeded with 0 (the job's own seeding still wins)"] * 2


def test_explicit_values_are_overridden_unless_the_plan_keeps_them(tmp_path: Path) -> None:
    """`num_workers=args.workers` with 0 is how scripts are written: trying the fix means
    replacing the value the script set (the log says so); --keep-explicit keeps it."""
    plan = {"dataloader_workers": {"num_workers": 2}}
    forced, run = probe(tmp_path, plan, "--explicit-workers", "0")
    assert forced["num_workers"] == 2
    done = applied(run)
    assert done["dataloader_workers"] == ["num_workers 0 -> 2 (the job set 0)"]
    kept, run = probe(tmp_path, plan, "--explicit-workers", "0", override_explicit=False)
    assert kept["num_workers"] == 0
    notes = [i["change"] for i in run["config"]["applied"] if not i["applied"]]
    assert notes == ["not applied: kept the job's num_workers=0 (set explicitly; --keep-explicit)"]


def test_model_fixes_channels_last_autocast_threads(tmp_path: Path) -> None:
    base, _ = probe(tmp_path, None)
    assert base["autocast_cpu"] is False and base["out_dtype"] == "torch.float32"
    fixed, run = probe(
        tmp_path,
        {"channels_last": {}, "bf16_autocast": {"cpu": True}, "cpu_threads": {"threads": 1}},
    )
    assert fixed["weight_channels_last"] is True and fixed["input_channels_last"] is True
    # inside the forward (the first call too), autocast is on and convs run in bf16
    assert fixed["autocast_cpu"] is True and fixed["out_dtype"] == "torch.bfloat16"
    assert fixed["threads"] == 1
    done = applied(run)
    assert "bf16_autocast" in done and "channels_last" in done and "cpu_threads" in done
    # bf16 changes numerics, a little: the losses are close, not equal
    assert fixed["losses"] != base["losses"]
    assert fixed["losses"] == pytest.approx(base["losses"], rel=0.05)


def test_bf16_is_not_applied_to_a_cpu_job_by_default(tmp_path: Path) -> None:
    fixed, run = probe(tmp_path, {"bf16_autocast": {}})
    assert fixed["autocast_cpu"] is False
    notes = [i["change"] for i in run["config"]["applied"] if i["fix"] == "bf16_autocast"]
    assert notes and notes[0].startswith("not applied: CPU job")


def test_ddp_settings(tmp_path: Path) -> None:
    fixed, run = probe(
        tmp_path,
        {
            "ddp_bucket_cap": {"bucket_cap_mb": 50},
            "ddp_gradient_as_bucket_view": {},
            "ddp_static_graph": {},
        },
        "--ddp",
    )
    assert fixed["ddp"] == {
        "bucket_cap_mb": 50.0,
        "gradient_as_bucket_view": True,
        "static_graph": True,
    }


def test_a_bad_plan_is_one_line_and_the_job_runs(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text("{not json")
    run_id, proc = jobs.run_job(tmp_path, "apply_probe.py", extra_env={ENV_PLAN: str(plan)})
    assert proc.returncode == 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("stepscope:")]
    assert len(lines) == 1 and "not applied" in lines[0]


@pytest.mark.slow
def test_torch_compile_of_the_model_forward(tmp_path: Path) -> None:
    base, _ = probe(tmp_path, None, "--steps", "3")
    fixed, run = probe(tmp_path, {"torch_compile": {}}, "--steps", "3")
    assert applied(run)["torch_compile"] == ["torch.compile(Sequential.forward)"]
    assert fixed["losses"] == pytest.approx(base["losses"], rel=1e-4)


def test_model_search_gives_up_and_removes_its_hooks(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"fixes": {"channels_last": {}}}))
    run_id, proc = jobs.run_job(tmp_path, "unowned_params.py", extra_env={ENV_PLAN: str(plan)})
    assert proc.returncode == 0 and proc.stdout == "done\n", proc.stderr
    with RunStore(tmp_path) as store:
        notes = store.run(run_id)["config"]["applied"]
    assert {
        "fix": "channels_last",
        "applied": False,
        "change": "not applied: no top-level module owns the optimizer's parameters",
        "verified": None,
    } in notes


def test_model_fixes_reach_both_networks_of_a_gan(tmp_path: Path) -> None:
    """Two optimizers, two models: the generator and the discriminator are both adopted."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"fixes": {"bf16_autocast": {"cpu": True}}, "seed": 0}))
    run_id, proc = jobs.run_job(
        tmp_path, "loops.py", "--pattern", "gan", extra_env={ENV_PLAN: str(plan)}
    )
    assert proc.returncode == 0, proc.stderr
    with RunStore(tmp_path) as store:
        entries = store.run(run_id)["config"]["applied"]
    autocast = [e for e in entries if e["fix"] == "bf16_autocast" and e["applied"]]
    assert len(autocast) == 2 and all(e["verified"] for e in autocast)


@pytest.mark.slow
def test_compiled_gan_keeps_its_losses_and_passes_the_quality_guard(tmp_path: Path) -> None:
    """torch_compile on a GAN was failed with "loss is NaN or infinite from step 0" while
    the job printed the baseline's losses: compiling made the first iteration longer than
    the forward-step wait, so it was cut into loss-less forward steps."""
    from stepscope.collectors.launch.launcher import launch_run
    from stepscope.optim_runner.guards.quality import check_quality, loss_series

    script = Path(__file__).resolve().parents[1] / "examples" / "corpus" / "dcgan_style.py"
    command = [sys.executable, str(script), "--nimages", "160"]
    series, outputs = [], []
    for n, fixes in enumerate(({}, {"torch_compile": {}})):
        plan = {"fixes": fixes, "seed": 0}
        run_id, code = launch_run(
            command, home=tmp_path, max_steps=8, quiet=True, plan=plan, output_path=f"out{n}.log"
        )
        assert code == 0
        with RunStore(tmp_path) as store:
            steps = store.steps(run_id)
            run = store.run(run_id)
        assert set(steps["kind"]) == {"optimizer"} and len(steps) == 8
        assert steps["loss"].notna().all()
        series.append(loss_series(steps))
        outputs.append(run)
    compiled = [e for e in outputs[1]["config"]["applied"] if e["fix"] == "torch_compile"]
    assert len(compiled) == 2 and all(e["verified"] for e in compiled)  # generator and critic
    assert series[1] == pytest.approx(series[0], rel=1e-3)
    assert check_quality([series[0]], [series[1]]).ok is True
