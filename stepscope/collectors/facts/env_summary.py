"""What about the machine and the environment can change a job's speed, for the run's row.

Recorded in every run's row (its ``env`` column) so that two runs can be compared.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from collections.abc import Mapping
from typing import Any

from stepscope.store.signing import RECORDED_ENV
from stepscope.store.url import ENV_VAR as STORE_ENV
from stepscope.store.url import redacted

# Only the variables that change how a PyTorch job performs (``RECORDED_ENV``, kept
# beside the run's signature, which covers them) are recorded. Nothing else from the
# environment is stored: it may hold secrets (the AWS_* credentials an s3:// artifact
# location reads, store/artifacts.py, must never reach the store; tests/test_artifacts.py
# greps for them).
RELEVANT_ENV = RECORDED_ENV


def env_summary(extra_env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What about this machine and environment can change a job's speed.

    ``extra_env``: variables the launcher adds to the job's environment; they are part
    of what the job ran with, so the relevant ones are recorded too.
    """
    merged = {**os.environ, **(extra_env or {})}
    return {
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "vars": {k: merged[k] for k in RELEVANT_ENV if k in merged},
        # which store the run was recorded in; a password in its URL is never recorded
        "store": redacted(merged[STORE_ENV]) if merged.get(STORE_ENV) else None,
    }
