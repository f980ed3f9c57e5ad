"""The job's memory limit: set before it starts, and read back when it is killed.

``stepscope run --memory-limit`` caps the job's address space (RLIMIT_AS) in the child
between fork and exec, so the cap holds for the job and every process it starts, and
never for the launcher or its sampler. Under it, torch's CPU allocator fails with
"can't allocate memory: you tried to allocate N bytes", a RuntimeError the job dies of
where it asked (the bootstrap records it: ``collectors/injob/oom_record.py``).

The kernel's OOM killer gives no message at all: the job is gone by SIGKILL. When its
last sampled RSS was near a limit (the cap above, or the cgroup's ``memory.max``), the
run's error says it likely ran out of memory instead of only "killed by SIGKILL".
"""

from __future__ import annotations

import contextlib
import resource
from collections.abc import Callable
from pathlib import Path
from typing import Any

MEMORY_LIMIT_KEY = "memory_limit"  # the run config's key: bytes of address space
NEAR_LIMIT = 0.9  # a killed job's last RSS at or above this share of a limit: likely OOM
CGROUP_ROOT = Path("/sys/fs/cgroup")


def address_space_limiter(limit: int | None) -> Callable[[], None] | None:
    """A ``preexec_fn`` that caps the child's address space at ``limit`` bytes (None: no
    cap, no ``preexec_fn``). Only async-signal-safe work runs in it: one system call."""
    if limit is None:
        return None

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (int(limit), int(limit)))

    return apply


def cgroup_memory_max(proc_cgroup: Path = Path("/proc/self/cgroup")) -> int | None:
    """The cgroup v2 ``memory.max`` of this process (which the job shares), or None
    where there is none, it is "max", or it cannot be read."""
    with contextlib.suppress(OSError, ValueError):
        for line in proc_cgroup.read_text().splitlines():
            hierarchy, _controllers, path = line.split(":", 2)
            if hierarchy != "0":
                continue
            text = (CGROUP_ROOT / path.lstrip("/") / "memory.max").read_text().strip()
            return None if text == "max" else int(text)
    return None


def last_rss(store: Any, run_id: int) -> float | None:
    """The job tree's last sampled resident set (the sampler's ``proc.rss_bytes``) while
    it was alive."""
    samples = store.samples(run_id)
    if samples.empty:
        return None
    rss = samples[(samples["scope"] == "proc") & (samples["metric"] == "rss_bytes")]
    rss = rss[rss["value"] > 0]  # a sample taken as the job died reads 0: not its last
    return None if rss.empty else float(rss["value"].iloc[-1])


def killed_near_limit(store: Any, run_id: int, memory_limit: int | None) -> str | None:
    """ "killed (SIGKILL) with RSS X of the limit Y: likely out of memory" where the last
    sampled RSS was within ``NEAR_LIMIT`` of the job's limit; None otherwise."""
    limits = [x for x in (memory_limit, cgroup_memory_max()) if x]
    rss = last_rss(store, run_id)
    if rss is None or not limits:
        return None
    limit = min(limits)
    if rss < NEAR_LIMIT * limit:
        return None
    return f"killed (SIGKILL) with RSS {_gib(rss)} of the limit {_gib(limit)}: likely out of memory"


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"
