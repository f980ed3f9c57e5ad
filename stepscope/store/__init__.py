"""The run store: one SQLite database (WAL) plus a folder per run."""

from stepscope.store.store import (
    ExperimentNotFound,
    RunNotFound,
    RunStore,
    StoreError,
    default_home,
)
from stepscope.store.writer import BufferedWriter

__all__ = [
    "BufferedWriter",
    "ExperimentNotFound",
    "RunNotFound",
    "RunStore",
    "StoreError",
    "default_home",
]
