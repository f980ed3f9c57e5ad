"""Shared test set-up: every test gets its own run store, never the user's ~/.stepscope.

The suite runs in parallel (pytest-xdist, one test file per worker at a time; see
pyproject.toml): the files that take longest are handed out first, so that no worker
is left with a long file at the end while the other idles.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# The suite runs two workers on two cores, each starting real torch jobs beside the
# other's: OpenMP threads that spin while they wait for a core (libgomp's default) burn
# a fifth of the suite's CPU for nothing there. Waiting threads sleep instead, in every
# job the tests start (they inherit the environment); thread counts are unchanged.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# For the same reason every trial of a test's experiment has the other worker's job
# beside it: busy trials are not run again here (optim_runner/repeats.py), which would
# add up to six trials to every experiment of the suite; tests of repeats turn them on.
os.environ.setdefault("STEPSCOPE_BUSY_REPEATS", "0")

# Scripts run on a real GPU by hand (see tests/gpu/README.md), not collected by pytest.
collect_ignore = ["gpu", "jobs"]
# The S3 endpoint fixtures (moto's server) for the tests of artifacts in object storage;
# a real PostgreSQL server (pg_url, store_backend: a test on both store backends).
pytest_plugins = ["s3_server", "pg_server"]

# The files with the longest total time (`pytest --durations=0` on 2 cores), longest
# first; every other file follows in the usual order. Only the order depends on this.
LONGEST_FIRST = (
    "test_experiment.py",
    "test_app_pages.py",
    "test_generation_optimize.py",
    "test_demo.py",
    "test_attach.py",
    "test_dashboard_e2e.py",
    "test_examples.py",
    "test_step_timer.py",
    "test_corpus.py",
    "test_apply.py",
    "test_generation_fixes.py",
    "test_generation_collect.py",
    "test_multinode.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: keeps the rest


@pytest.fixture(autouse=True)
def _isolated_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "stepscope-home"
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    monkeypatch.delenv("STEPSCOPE_STORE", raising=False)  # tests opt in: store_backend
    return home
