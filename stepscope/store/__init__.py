"""The run store: one database (SQLite in WAL mode, or PostgreSQL) plus a folder per run."""

from stepscope.store.experiments import ExperimentNotFound
from stepscope.store.runs import RunNotFound
from stepscope.store.store import RunStore, StoreError, default_home
from stepscope.store.url import redacted, resolve_store_url
from stepscope.store.writer import BufferedWriter

__all__ = [
    "BufferedWriter",
    "ExperimentNotFound",
    "RunNotFound",
    "RunStore",
    "StoreError",
    "default_home",
    "redacted",
    "resolve_store_url",
]
