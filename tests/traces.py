"""The real traces the tests read (tests/data/, see its README), by name."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

TRACES = Path(__file__).resolve().parent / "data"

RESNET_NW0 = "resnet50_v100_num_workers_0.pt.trace.json.gz"
RESNET_NW4 = "resnet50_v100_num_workers_4.pt.trace.json.gz"
A100 = "a100_nccl_3steps.json.gz"
V100_NS = "v100_ddp_rank0_ns_resolution.pt.trace.json.gz"
RANK0 = "sampled_2ranks_rank-0.json.gz"
RANK1 = "sampled_2ranks_rank-1.json.gz"
CPU_ONLY = "cpu_only_rank34.pt.trace.json.gz"
MI250 = "amd_mi250_minitoy.json.gz"
MEMORY_TIMELINE = "memory_timeline.raw.gz"
ALL = [RESNET_NW0, RESNET_NW4, A100, V100_NS, RANK0, RANK1, CPU_ONLY, MI250]


def trace_path(name: str) -> Path:
    """Path of a trace in tests/data; a missing one fails the test (it is part of the
    repository: a clone without it is broken, not a machine without a GPU)."""
    path = TRACES / name
    if not path.exists():
        pytest.fail(f"test input {name} is missing from {TRACES}", pytrace=False)
    return path


def in_run_folder(store: Any, run_id: int, trace: Path) -> Path:
    """A copy of ``trace`` in the run's folder, where a capture writes its file: the only
    place (with the artifact location) a run's artifact rows may name (store/artifact_paths)."""
    dest = store.run_dir(run_id) / trace.name
    shutil.copyfile(trace, dest)
    return dest
