"""stepscope: find out why a PyTorch job is slow, fix it, and prove the fix.

Importing this package must stay cheap and must not import torch: the bootstrap
imports it inside every Python process of the user's job. So the notebook API
(``stepscope.analyze``, ``runs``, ``run``, ``compare``, ``diff``, ``check``, ``memory``: see
``stepscope/api.py``), which needs pandas and the analyzers, is imported on first use of
one of its names, through the module-level ``__getattr__`` below (PEP 562).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

# names of stepscope.api, read from it on first use
_API = (
    "analyze",
    "runs",
    "run",
    "compare",
    "check",
    "diff",
    "memory",
    "MemoryBreakdown",
    "Report",
    "Run",
    "Comparison",
    "CheckResult",
    "RunDiff",
    "TraceError",
)


def mark_step() -> None:
    """Mark the end of a step explicitly; overrides optimizer- and forward-based detection.

    A no-op when the process does not run under `stepscope run`.
    """
    # local: the bootstrap imports stepscope in every process; the collectors only here
    from stepscope.collectors.steps import step_timer

    step_timer.mark_step()


def __getattr__(name: str) -> Any:
    if name in _API:
        # local: pandas and the analyzers, only once a notebook asks for them
        from stepscope import api

        return getattr(api, name)
    raise AttributeError(f"module 'stepscope' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])


__all__ = ["__version__", "mark_step", *_API]
