"""Out of memory on corpus jobs written the way people write them, explained at exit and
made to fit by ``optimize`` with no code change (issue 38, part 6).

Two jobs beside the hand-written GPT trainer of tests/test_oom_fit.py: a Hugging Face
``Trainer`` fine-tune (examples/corpus/hf_trainer.py: a GPT-2 whose attention scores,
8 heads x 512 x 512 per sample, are most of its memory; the model's own
``gradient_checkpointing_enable`` is the switch) and a ResNet-style CNN at a high
resolution (examples/corpus/resnet_highres.py: BasicBlocks in an ``nn.Sequential``
wrapped by torch's ``apply_activation_checkpointing``, a DataLoader, SGD). Each runs
under a process memory limit between its peak with and without checkpointing.

The jobs run on one thread with glibc's mapping threshold fixed at 1 MiB
(``MALLOC_MMAP_THRESHOLD_``): with the default, freed feature maps stay in a heap that
keeps what it held, and the same job's peak address space moved by 480 MiB from one
run to the next (docs/guides/out-of-memory.md). Measured so, on a loaded 2-core
machine (peak address space, plain / checkpointed, two runs each, equal to the MiB):

* hf_trainer ``HF_JOB``: 2326 / 1221 MiB; the limit, 1.8 GB (1717 MiB), sits 609 MiB
  below the one and 496 MiB above the other;
* resnet_highres ``CNN_JOB``: 1657 / 1080 MiB; the limit, 1.4 GB (1335 MiB), sits 322
  MiB below and 255 MiB above.

The checks compare what happened (statuses, failure kinds, the fixes applied, peaks
against the limit), never times.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from dashboard_helpers import memory_cli

from stepscope.optim_runner.trials.failures import ran_out_of_memory
from stepscope.store import RunStore

pytestmark = pytest.mark.slow

CORPUS = Path(__file__).resolve().parents[1] / "examples" / "corpus"
ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": "1048576"}
TIMEOUT_S = 480
STEPS = "3"  # per trial: the first is warm-up, two are timed


class Job(NamedTuple):
    script: str
    args: tuple[str, ...]
    limit: str
    limit_bytes: int
    change: str  # what the checkpointing fix says it did


HF_JOB = Job(
    "hf_trainer.py",
    (
        "--seq-len",
        "512",
        "--n-layer",
        "6",
        "--n-embd",
        "64",
        "--n-head",
        "8",
        "--per-device-train-batch-size",
        "8",
        "--gradient-accumulation-steps",
        "1",
        "--max-steps",
        "6",
    ),  # fmt: skip
    "1.8GB",
    1_800_000_000,
    "GPT2LMHeadModel.activation_checkpointing_enable(use_reentrant=False)",
)
CNN_JOB = Job(
    "resnet_highres.py",
    ("--blocks", "12", "--image-size", "128", "--batch-size", "16", "--iters", "6"),
    "1.4GB",
    1_400_000_000,
    "checkpointed 14 BasicBlock blocks of layer1, layer2",
)
JOBS = {"hf_trainer": HF_JOB, "resnet_highres": CNN_JOB}


def stepscope(home: Path, *args: str) -> Any:
    return memory_cli(home, *args, timeout=TIMEOUT_S, env=ALLOCATOR)


@pytest.fixture(scope="module", params=sorted(JOBS))
def oom_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """The job run out of memory under its limit: (job, home, the run's row, stderr)."""
    job = JOBS[request.param]
    home = tmp_path_factory.mktemp(request.param)
    proc = stepscope(
        home, "run", "--memory-limit", job.limit, "--", sys.executable, str(CORPUS / job.script),
        *job.args,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    with RunStore(home) as store:
        run = store.run(store.resolve_run("last"))
    return job, home, run, proc.stderr


def test_the_oom_is_explained_at_exit(oom_run: tuple) -> None:
    job, _home, run, stderr = oom_run
    assert run["status"] == "failed" and ran_out_of_memory(run), run.get("error")
    (record,) = run["config"]["oom"]
    assert record["bytes_asked"] > 0 and record["step"] == 0  # its first step asks too much
    assert record["limit_bytes"] == job.limit_bytes
    assert record["source"].startswith(str(CORPUS / job.script))  # the job's own line
    verdict = [line for line in stderr.splitlines() if line.startswith("stepscope:")]
    assert any("verdict: out of memory" in line for line in verdict), verdict
    assert any("frees memory: activation_checkpointing" in line for line in verdict), verdict
    (asked,) = [line for line in verdict if "asked by " in line]
    assert job.script in asked, asked


def test_optimize_makes_it_fit_under_the_same_limit(oom_run: tuple) -> None:
    job, home, run, _stderr = oom_run
    proc = stepscope(home, "optimize", str(run["id"]), "--trials", "1", "--steps", STEPS, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout)
    assert result["goal"] == "fit"
    assert "activation_checkpointing" in [f["id"] for f in result["fixes"]]
    assert result["out_of_memory"]["runs_out"] is True
    fits = {c["name"]: c for c in result["candidates"] if c.get("fits")}
    assert fits, [(c["name"], c.get("fit"), c.get("error")) for c in result["candidates"]]
    best = result["best"]
    assert best["fits"] is True and "activation_checkpointing" in best["fixes"]
    (kept,) = [c for c in fits.values() if c["fixes"] == best["fixes"]]
    with RunStore(home) as store:
        trial = store.run(kept["runs"][0])
    assert trial["status"] in ("completed", "stopped") and not ran_out_of_memory(trial)
    assert trial["config"]["memory_limit"] == job.limit_bytes
    mine = [e for e in trial["config"]["applied"] if e["fix"] == "activation_checkpointing"]
    assert all(e["applied"] for e in mine) and any(job.change in e["change"] for e in mine), mine
    # predicted in bytes on the job's own inputs (the Trainer's keywords: at a block's call)
    assert any("predicted saving" in e["change"] for e in mine), mine
    assert 0 < kept["peak_bytes"] < job.limit_bytes
