"""Stack samples: py-spy's raw format, the phase of each sample, the shares, the store."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from stepscope.analyzers.steps.stacks import (
    classify,
    classify_samples,
    parse_frames,
    phase_shares,
    stack_summary,
    top_sites,
)
from stepscope.collectors.samplers.stack_sampler import explain_failure, parse_raw
from stepscope.store import RunStore

SITE = "/venv/lib/python3.11/site-packages"
CALL = f"Module._call_impl ({SITE}/torch/nn/modules/module.py:1789)"
NEXT = f"_BaseDataLoaderIter.__next__ ({SITE}/torch/utils/data/dataloader.py:734)"
BACKWARD = f"Tensor.backward ({SITE}/torch/_tensor.py:623)"
OPT = f"SGD.step ({SITE}/torch/optim/sgd.py:120)"
WORKER = f"_worker_loop ({SITE}/torch/utils/data/_utils/worker.py:300)"


def _train(line: int) -> str:
    return f"<module> (/job/train.py:90);train (/job/train.py:{line})"


def test_parse_raw_reads_processes_threads_and_skips_a_cut_off_line() -> None:
    text = (
        f'process 10:"python train.py";thread (10): MainThread;{_train(40)};{NEXT} 7\n'
        f'process 10:"python train.py";process 11:"python train.py";thread (0xB): MainThread;'
        f"{WORKER} 3\n"
        f'process 10:"python train.py";thread (12): pin_memory;{_train(40)} 2\n'
        f'process 10:"python train.py";thread (10): MainThread;{_train(41)};{CALL}'  # cut off
    )
    rows = parse_raw(text, root_pid=10)
    assert rows == [
        (10, 10, "MainThread", f"{_train(40)};{NEXT}", 7),
        (11, 11, "MainThread", WORKER, 3),
        (10, 12, "pin_memory", _train(40), 2),
    ]
    # without --subprocesses there is no process prefix: the root pid is meant
    assert parse_raw(f"thread (10): MainThread;{_train(40)} 4", 10)[0][:2] == (10, 10)
    assert parse_raw("not py-spy output at all\n{}", 10) == []


@pytest.mark.parametrize(
    ("frames", "phase"),
    [
        (f"{_train(40)};{NEXT}", "data_loading"),
        # the innermost frame waits for work: a server between requests, a queue, a lock
        (
            "<module> (/srv/app.py:30);BaseServer.serve_forever (/usr/lib/python3.11/"
            "socketserver.py:233);_PollSelector.select (/usr/lib/python3.11/selectors.py:415)",
            "idle",
        ),
        ("<module> (/srv/app.py:30);Queue.get (/usr/lib/python3.11/queue.py:171)", "idle"),
        ("main (/srv/app.py:9);Condition.wait (/usr/lib/python3.11/threading.py:327)", "idle"),
        # a DataLoader's wait on its queue is the input pipeline, not idleness
        (f"{_train(40)};{NEXT};Queue.get (/usr/lib/python3.11/queue.py:171)", "data_loading"),
        (f"{_train(40)};Images.__getitem__ (/job/data.py:12)", "data_loading"),
        (f"{_train(41)};{CALL};Net.forward (/job/model.py:20)", "forward"),
        (
            f"{_train(41)};OptimizedModule.__call__ ({SITE}/torch/_dynamo/eval_frame.py:400)",
            "forward",
        ),
        (f"{_train(42)};{BACKWARD}", "backward"),
        (f"{_train(43)};{OPT}", "optimizer"),
        (f"{_train(44)};log (/job/train.py:12)", "elsewhere"),
        (f"{_train(45)};synchronize ({SITE}/torch/cuda/__init__.py:1040)", "sync"),
    ],
)
def test_each_sample_gets_the_phase_of_its_frames(frames: str, phase: str) -> None:
    assert classify(parse_frames(frames)) == phase


def test_a_line_that_reads_a_tensor_back_is_a_sync(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("loss = model(x)\nprint(loss.item())\nloss.backward()\n")
    on_item = f"train ({script}:2)"
    assert classify(parse_frames(on_item)) == "sync"
    assert classify(parse_frames(f"train ({script}:3)")) == "elsewhere"
    # the sync line sits in the job's code: under a library frame it is that frame's phase
    assert classify(parse_frames(f"{on_item};{BACKWARD}")) == "backward"


def _samples(rows: list[tuple[int, int, str, str, int]], t: float = 0.0) -> pd.DataFrame:
    return pd.DataFrame(
        [(t, t + 5, *r) for r in rows],
        columns=["t_start", "t_end", "pid", "tid", "thread", "frames", "samples"],
    )


def test_shares_count_main_threads_of_training_processes_only() -> None:
    df = _samples(
        [
            (10, 10, "MainThread", f"{_train(40)};{NEXT}", 30),  # rank 0
            (10, 10, "MainThread", f"{_train(41)};{CALL}", 10),
            (10, 12, "pin_memory", f"{_train(40)};{NEXT}", 40),  # not the main thread
            (11, 11, "MainThread", WORKER, 50),  # a DataLoader worker
            (20, 20, "MainThread", f"{_train(42)};{BACKWARD}", 20),  # rank 1
            (9, 9, "MainThread", "_monitor (/venv/lib/python3.11/site-packages/x.py:1)", 99),
        ]
    )
    classified = classify_samples(df)
    assert set(classified["pid"]) == {10, 20}  # no worker, no launcher
    shares = phase_shares(classified).set_index("category")["share"]
    # averaged over the two ranks: rank 0 is 75 % data, 25 % forward; rank 1 all backward
    assert shares["data_loading"] == pytest.approx(0.375)
    assert shares["forward"] == pytest.approx(0.125)
    assert shares["backward"] == pytest.approx(0.5)
    assert shares.sum() == pytest.approx(1.0)
    sites = top_sites(classified)
    assert sites.iloc[0]["site"] == "train (train.py:40)" and sites.iloc[0]["samples"] == 30


def test_store_keeps_each_distinct_stack_once(tmp_path: Path) -> None:
    rows = [
        (10, 10, "MainThread", f"{_train(40)};{NEXT}", 7),
        (10, 10, "MainThread", _train(41), 2),
    ]
    with RunStore(tmp_path) as store:
        run_id = store.create_run(["python", "train.py"])
        assert store.add_stack_samples(run_id, 0.0, 5.0, rows) == 9
        assert store.add_stack_samples(run_id, 5.0, 10.0, rows[:1]) == 7
        back = store.stack_samples(run_id)
        distinct = store._conn.execute("SELECT COUNT(*) FROM stacks").fetchone()[0]
    assert distinct == 2
    assert back["samples"].tolist() == [7, 2, 7] and back["t_start"].tolist() == [0, 0, 5]
    assert back.iloc[0]["frames"] == f"{_train(40)};{NEXT}"


def test_py_spy_errors_become_one_line_that_says_what_to_do() -> None:
    perm = "Error: Permission denied (os error 13)\n\nStack backtrace:\n 0: x"
    assert "the OS forbids reading process 999999's stacks" in explain_failure(999999, perm)
    gone = "Error: Failed to get process executable name. Check that the process is running."
    assert explain_failure(999999, gone) == "process 999999 is gone"
    other = "Error: Failed to find python version from target process"
    assert explain_failure(999999, other) == (
        "process 999999 is not running Python (py-spy found no interpreter in it)"
    )
    for message in (explain_failure(999999, perm), explain_failure(999999, "boom\nmore")):
        assert "\n" not in message


def test_a_ddp_job_is_recognised_on_its_stacks() -> None:
    """DDP's all-reduce hides inside backward (C++): the summary says DDP was seen, so the
    diagnosis can say so instead of calling all of backward compute."""
    ddp_call = f"DistributedDataParallel.forward ({SITE}/torch/nn/parallel/distributed.py:1600)"
    plain = stack_summary(_samples([(10, 10, "MainThread", f"{_train(41)};{CALL}", 5)]))
    ddp = stack_summary(
        _samples(
            [
                (10, 10, "MainThread", f"{_train(41)};{CALL};{ddp_call}", 5),
                (10, 10, "MainThread", f"{_train(42)};{BACKWARD}", 15),
            ]
        )
    )
    assert plain["ddp"] is False and ddp["ddp"] is True
    assert ddp["shares"]["backward"] == pytest.approx(0.75)
