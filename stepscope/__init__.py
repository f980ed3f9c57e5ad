"""stepscope: find out why a PyTorch job is slow, fix it, and prove the fix.

Importing this package must stay cheap and must not import torch: the bootstrap
imports it inside every Python process of the user's job.
"""

from __future__ import annotations

__version__ = "0.1.0"


def mark_step() -> None:
    """Mark the end of a step explicitly; overrides optimizer- and forward-based detection.

    A no-op when the process does not run under `stepscope run`.
    """
    from stepscope.collectors import step_timer

    step_timer.mark_step()


__all__ = ["__version__", "mark_step"]
