"""The run store: one SQLite database (WAL) plus a folder per run."""

from stepscope.store.store import RunNotFound, RunStore, StoreError, default_home
from stepscope.store.writer import BufferedWriter

__all__ = ["BufferedWriter", "RunNotFound", "RunStore", "StoreError", "default_home"]
