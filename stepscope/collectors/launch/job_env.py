"""The environment a job runs in under stepscope.

Environment variables are the only channel that reaches every Python process of a job
(``torchrun`` ranks, ``subprocess`` children, spawned DataLoader workers) without the
user's code cooperating, so the launcher's whole message to the bootstrap is this dict.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from stepscope.collectors.launch import contract

BOOT_DIR = Path(__file__).resolve().parents[1] / "injob" / "boot"
# The directory holding the `stepscope` package: the bootstrap appends it to sys.path
# when the job's interpreter (another venv, a container's python) cannot import us.
PACKAGE_PARENT = Path(__file__).resolve().parents[3]


def build_job_env(
    run_id: int,
    home: str | os.PathLike[str],
    run_dir: str | os.PathLike[str],
    *,
    max_steps: int | None = None,
    profile_at: int | str | None = None,
    profile_steps: int | None = None,
    flush_s: float | None = None,
    base_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Return ``base_env`` (default: os.environ) plus what the bootstrap needs.

    The boot directory goes first on PYTHONPATH so our ``sitecustomize`` wins; the
    user's PYTHONPATH follows unchanged, and the bootstrap chains to any
    sitecustomize found there or in site-packages.
    """
    env = dict(os.environ if base_env is None else base_env)
    # Options of an outer stepscope run must not leak into this one.
    for key in (contract.ENV_MAX_STEPS, contract.ENV_PROFILE_AT, contract.ENV_PROFILE_STEPS):
        env.pop(key, None)
    env.pop(contract.ENV_DISABLE, None)

    prev = env.get("PYTHONPATH", "")
    parts = [p for p in prev.split(os.pathsep) if p and Path(p).resolve() != BOOT_DIR]
    env[contract.ENV_PREV_PYTHONPATH] = os.pathsep.join(parts)
    env["PYTHONPATH"] = os.pathsep.join([str(BOOT_DIR), *parts])

    env[contract.ENV_RUN_ID] = str(int(run_id))
    env[contract.ENV_HOME] = str(Path(home).expanduser().resolve())
    env[contract.ENV_RUN_DIR] = str(Path(run_dir).expanduser().resolve())
    env[contract.ENV_PACKAGE_PATH] = str(PACKAGE_PARENT)
    if max_steps is not None:
        env[contract.ENV_MAX_STEPS] = str(int(max_steps))
    if profile_at is not None:
        auto = profile_at == contract.PROFILE_AUTO
        env[contract.ENV_PROFILE_AT] = contract.PROFILE_AUTO if auto else str(int(profile_at))
        env[contract.ENV_PROFILE_STEPS] = str(int(profile_steps or 3))
    if flush_s is not None:
        env[contract.ENV_FLUSH_S] = str(float(flush_s))
    return env
