"""Shared test set-up: every test gets its own run store, never the user's ~/.stepscope."""

from __future__ import annotations

from pathlib import Path

import pytest

# Scripts run on a real GPU by hand (see tests/gpu/README.md), not collected by pytest.
collect_ignore = ["gpu", "jobs"]
# The S3 endpoint fixtures (moto's server) for the tests of artifacts in object storage;
# a real PostgreSQL server (pg_url, store_backend: a test on both store backends).
pytest_plugins = ["s3_server", "pg_server"]


@pytest.fixture(autouse=True)
def _isolated_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "stepscope-home"
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    monkeypatch.delenv("STEPSCOPE_STORE", raising=False)  # tests opt in: store_backend
    return home
