"""Out of memory under `stepscope run --memory-limit`: recorded where it happens, explained
at exit.

Real jobs under the real launcher and a real SQLite store: the corpus's GPT trainer
(examples/corpus/gpt_trainer.py) at a batch whose attention scores (batch x heads x
seq x seq floats, 512 MiB here) cannot fit under a 1.5 GB address-space limit, the same
script at a small batch under the same limit, and a job that runs out after three
steps (tests/jobs/oom_later.py). The checks compare what was recorded with what the job
did: the bytes asked against the limit, the step, the user's line, the top finding and
the verdict's words; never times.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from dashboard_helpers import memory_cli

from stepscope.app.cli.sizes import parse_size
from stepscope.collectors.launch.memory_limit import (
    NEAR_LIMIT,
    cgroup_memory_max,
    killed_near_limit,
)
from stepscope.errors import bytes_asked, is_out_of_memory
from stepscope.store import RunStore

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
GPT = str(REPO / "examples" / "corpus" / "gpt_trainer.py")
OOM_LATER = str(REPO / "tests" / "jobs" / "oom_later.py")
LIMIT = "1.5GB"
LIMIT_BYTES = 1_500_000_000
SMALL = ("--layers", "2", "--dim", "64", "--steps", "3")
TIMEOUT_S = 240


def stepscope(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return memory_cli(home, *args, timeout=TIMEOUT_S)


def last_run(home: Path) -> dict:
    with RunStore(home) as store:
        run = store.run(store.resolve_run("last"))
        run["findings"] = store.findings(int(run["id"]))
        return run


@pytest.fixture(scope="module")
def gpt_oom(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, dict]:
    home = tmp_path_factory.mktemp("gpt_oom")
    proc = stepscope(
        home, "run", "--memory-limit", LIMIT, "--", sys.executable, GPT, "--batch", "64", *SMALL
    )
    return proc, last_run(home)


def test_the_job_fails_with_the_cpu_allocators_error(gpt_oom) -> None:
    proc, run = gpt_oom
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "can't allocate memory" in proc.stderr  # the job's own traceback passes through
    assert run["status"] == "failed"
    assert is_out_of_memory(run["error"])
    assert run["config"]["memory_limit"] == LIMIT_BYTES


def test_the_oom_record_says_what_was_asked_where(gpt_oom) -> None:
    _, run = gpt_oom
    (record,) = run["config"]["oom"]
    # batch 64 x 8 heads x 512 x 512 float32 attention scores: 512 MiB
    assert record["bytes_asked"] == 64 * 8 * 512 * 512 * 4 == bytes_asked(run["error"])
    assert record["limit_bytes"] == LIMIT_BYTES
    assert record["address_space_bytes"] + record["bytes_asked"] > 0
    assert 0 < record["rss_bytes"] < LIMIT_BYTES
    assert record["step"] == 0  # in the first step: nothing completed before it
    assert record["source"].startswith(f"{GPT}:")
    assert "att = (q @ k.transpose(-2, -1))" in record["source"]
    assert "cuda_total_bytes" not in record  # a CPU job never touches CUDA


def test_the_oom_record_says_what_held_the_memory(gpt_oom, monkeypatch: pytest.MonkeyPatch) -> None:
    """In the first step's forward: the model's parameters and its causal masks, no
    gradient yet, and no optimizer state (AdamW makes its moments at its first step),
    each counted as the same model built here holds it."""
    _, run = gpt_oom
    (record,) = run["config"]["oom"]
    held = record["model_state"]
    monkeypatch.setattr(sys, "argv", ["gpt_trainer.py"])
    spec = importlib.util.spec_from_file_location("gpt_trainer", GPT)
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    model = job.GPT(4096, 64, 2, 8, 512)  # --vocab and --heads as default, SMALL's others
    storages = {
        p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()
    }
    masks = {b.untyped_storage().data_ptr(): b.untyped_storage().nbytes() for b in model.buffers()}
    assert held["parameters"] == sum(storages.values())
    assert held["buffers"] == sum(masks.values()) > 0
    assert held["gradients"] == 0 and held["optimizer_state"] == 0 and held["optimizers"] == 1


def test_the_verdict_explains_the_oom_and_not_compute(gpt_oom) -> None:
    proc, run = gpt_oom
    top = run["findings"][0]
    assert top.key == "memory/capacity"
    assert len(run["findings"]) == 1  # a step cut short by the OOM has no shares to read
    verdict = proc.stderr[proc.stderr.index("stepscope: verdict:") :]
    assert "out of memory" in verdict
    assert "asked for 512.0 MiB" in verdict
    assert "gpt_trainer.py:" in verdict and "in step 0" in verdict
    assert "frees memory: activation_checkpointing (applied by stepscope)" in verdict
    assert "Compute" not in verdict and "step time" not in verdict
    # what held the memory: the model's state, and the step's own (most of it)
    assert "held by the model's state: parameters " in verdict
    assert "the step's (activations, temporaries and the process's libraries)" in verdict
    assert "would free (advice): sharding over 2 ranks (FSDP) about" in verdict


def test_an_oom_after_some_steps_ranks_first(tmp_path: Path) -> None:
    proc = stepscope(tmp_path, "run", "--memory-limit", LIMIT, "--", sys.executable, OOM_LATER)
    run = last_run(tmp_path)
    assert proc.returncode == 1 and run["status"] == "failed", proc.stderr[-2000:]
    (record,) = run["config"]["oom"]
    assert record["bytes_asked"] == 200000 * 1024 * 4
    assert record["bytes_asked"] + record["address_space_bytes"] > LIMIT_BYTES
    assert record["step"] == 3
    assert "oom_later.py:" in record["source"] and "model(x)" in record["source"]
    findings = run["findings"]
    assert findings[0].key == "memory/capacity" and len(findings) > 1  # first among others
    texts = " | ".join(e.text for e in findings[0].evidence)
    for words in ("asked for 781.2 MiB", "the limit: ", "in step 3", "oom_later.py:"):
        assert words in texts
    assert "verdict: out of memory" in proc.stderr
    show = stepscope(tmp_path, "show", str(run["id"]))
    assert "memory limit" in show.stdout and "out of memory" in show.stdout


def test_a_small_batch_fits_under_the_same_limit(tmp_path: Path) -> None:
    proc = stepscope(
        tmp_path,
        "run",
        "--memory-limit",
        LIMIT,
        "--",
        sys.executable,
        GPT,
        "--batch",
        "2",
        "--seq",
        "128",
        *SMALL,
    )
    run = last_run(tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert run["status"] == "completed" and run["config"]["memory_limit"] == LIMIT_BYTES
    assert "oom" not in run["config"]
    assert all(f.key != "memory/capacity" for f in run["findings"])
    corpus = json.loads(proc.stdout.strip().splitlines()[-1].removeprefix("CORPUS "))
    assert corpus["iterations"] == 3


def test_no_limit_no_cap(tmp_path: Path) -> None:
    proc = stepscope(
        tmp_path, "run", "--", sys.executable, GPT, "--batch", "2", "--seq", "128", *SMALL
    )
    run = last_run(tmp_path)
    assert proc.returncode == 0 and run["status"] == "completed", proc.stderr[-2000:]
    assert "memory_limit" not in run["config"] and "oom" not in run["config"]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("-1GB", "more than 0"),
        ("0", "more than 0"),
        ("2.5XB", "unknown unit"),
        ("lots", "not a size"),
    ],
)
def test_a_bad_memory_limit_is_one_line_and_runs_nothing(
    tmp_path: Path, text: str, problem: str
) -> None:
    proc = stepscope(
        tmp_path, "run", f"--memory-limit={text}", "--", sys.executable, "-c", "print(1)"
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stepscope: --memory-limit: ")
    assert problem in lines[0] and proc.stdout == ""
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_sizes_in_every_unit() -> None:
    assert parse_size("2.5GB") == 2_500_000_000
    assert parse_size("2500MiB") == 2500 * 2**20
    assert parse_size("3000000000") == 3_000_000_000
    assert parse_size("512 kib") == 512 * 1024
    assert parse_size("1KB") == 1000


def test_cuda_oom_message_bytes() -> None:
    text = "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79 GiB"
    assert is_out_of_memory(text) and bytes_asked(text) == 20 * 2**30
    assert not is_out_of_memory("RuntimeError: shape mismatch")


def test_sigkill_near_the_limit_is_likely_out_of_memory(tmp_path: Path) -> None:
    with RunStore(tmp_path) as store:
        run_id = store.create_run(["python", "job.py"])
        store.add_samples(
            run_id, [(1.0, "proc", "rss_bytes", 0.5e9), (2.0, "proc", "rss_bytes", 0.97e9)]
        )
        said = killed_near_limit(store, run_id, 10**9)
        assert said is not None
        assert said.startswith("killed (SIGKILL) with RSS 0.90 GiB of the limit 0.93 GiB")
        assert said.endswith("likely out of memory") and is_out_of_memory(said)
        cgroup = cgroup_memory_max()
        if cgroup is None or NEAR_LIMIT * cgroup > 0.97e9:  # no other limit it is near
            assert killed_near_limit(store, run_id, 4 * 10**9) is None


def test_an_oom_before_any_step_still_gets_the_explanation(tmp_path: Path) -> None:
    """The job runs out building its model's weights: no step at all was recorded."""
    script = tmp_path / "big_model.py"
    script.write_text(
        "import torch\n"
        "table = torch.nn.Embedding(1_000_000, 1024)  # 4 GB of weights\n"
        "print('never here')\n"
    )
    proc = stepscope(tmp_path, "run", "--memory-limit", LIMIT, "--", sys.executable, str(script))
    run = last_run(tmp_path)
    assert proc.returncode == 1 and "never here" not in proc.stdout, proc.stderr[-2000:]
    (record,) = run["config"]["oom"]
    assert record["bytes_asked"] == 1_000_000 * 1024 * 4 > LIMIT_BYTES
    assert record["source"] == f"{script}:2 in <module>: " + script.read_text().splitlines()[1]
    assert [f.key for f in run["findings"]] == ["memory/capacity"]
    assert "verdict: out of memory" in proc.stderr and "asked for 3.8 GiB" in proc.stderr


def test_trials_replay_the_runs_memory_limit(tmp_path: Path) -> None:
    """An experiment's trials run under the baseline's limit (each says so from inside)."""
    job = ("--batches", ",".join(["8"] * 8), "--print-limit")
    proc = stepscope(
        tmp_path, "run", "--memory-limit", LIMIT, "--", sys.executable, OOM_LATER, *job
    )
    assert proc.returncode == 0 and f"RLIMIT_AS {LIMIT_BYTES}" in proc.stdout, proc.stderr[-2000:]
    base = int(last_run(tmp_path)["id"])
    out = stepscope(
        tmp_path,
        "optimize",
        str(base),
        "--fixes",
        "fused_optimizer",
        "--steps",
        "4",
        "--trials",
        "1",
        "--json",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    with RunStore(tmp_path) as store:
        runs = store.run_list()
        trials = runs.loc[runs["parent_run_id"] == base, "id"].tolist()
        assert trials
        for trial in trials:
            run = store.run(int(trial))
            assert run["config"]["memory_limit"] == LIMIT_BYTES
            log = (store.run_dir(int(run["id"])) / "output.log").read_text()
            assert f"RLIMIT_AS {LIMIT_BYTES}" in log


def test_a_sigkill_near_the_limit_reads_as_out_of_memory(tmp_path: Path) -> None:
    """As the kernel's OOM killer leaves it: no message, SIGKILL, RSS near the limit (the
    job fills 1.4 GB of its 1.5 GB, waits until the sampler has seen it, then is killed;
    plain sqlite3 reads the store: pandas would not fit beside the block)."""
    script = tmp_path / "fill.py"
    script.write_text(
        "import os, signal, sqlite3, time\n"
        "block = bytearray(1_400_000_000)\n"
        "for i in range(0, len(block), 4096):\n"
        "    block[i] = 1  # touched: resident\n"
        "db = sqlite3.connect(os.path.join(os.environ['STEPSCOPE_HOME'], 'stepscope.db'))\n"
        "query = \"SELECT MAX(value) FROM samples WHERE run_id=? AND metric='rss_bytes'\"\n"
        "for _ in range(600):  # at most a minute\n"
        "    seen = db.execute(query, (int(os.environ['STEPSCOPE_RUN_ID']),)).fetchone()[0]\n"
        "    if seen and seen > 1.35e9:\n"
        "        break\n"
        "    time.sleep(0.1)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = stepscope(
        tmp_path, "run", "--memory-limit", LIMIT, "--sample-interval", "0.2", "--",
        sys.executable, str(script),
    )  # fmt: skip
    run = last_run(tmp_path)
    assert proc.returncode == 137 and run["status"] == "killed", proc.stderr[-2000:]
    assert run["error"].startswith("killed (SIGKILL) with RSS 1.")
    assert run["error"].endswith("of the limit 1.40 GiB: likely out of memory")
