"""The run store: one SQLite database (WAL) plus a folder per run."""

from stepscope.store.experiments import ExperimentNotFound
from stepscope.store.runs import RunNotFound
from stepscope.store.store import RunStore, StoreError, default_home
from stepscope.store.writer import BufferedWriter

__all__ = [
    "BufferedWriter",
    "ExperimentNotFound",
    "RunNotFound",
    "RunStore",
    "StoreError",
    "default_home",
]
