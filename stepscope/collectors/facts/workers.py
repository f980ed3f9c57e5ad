"""Training processes beside the rank's own: which worker a process is, and which one
takes the rank's capture.

A hogwild job (pytorch/examples ``mnist_hogwild``) trains in processes it starts with
``torch.multiprocessing``/``multiprocessing`` (``Process``, ``Pool``; spawn, fork or
forkserver) that share one model and have no distributed rank. Each is a *worker* of the
run: its steps are a series of their own (the store's ``steps.worker``), numbered by
multiprocessing's own process number, so they neither overwrite each other's rows nor the
rank's. A process with a distributed rank (``mp.spawn`` DDP, ``torchrun``) is worker 0
of its rank, as is the process the launcher started; DataLoader workers never train
(the step timer leaves them inert) and never get here.

Every training process would otherwise take its own default capture: the first process
of a rank to reach its capture window claims it (a file in the run folder, created
exclusively), the others leave it, so a rank's trace is one process's, as the analyzers
expect.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

MAIN = 0  # the rank's own process


def training_worker(torch: Any) -> int:
    """This process's worker number: 0 for a rank's own process, N for the training
    process multiprocessing numbered N (its ``_identity``; a nested one by its pid)."""
    mp = sys.modules.get("multiprocessing")
    if mp is None or mp.parent_process() is None:
        return MAIN
    with contextlib.suppress(Exception):
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return MAIN  # a rank of its own (mp.spawn DDP)
    identity = getattr(mp.current_process(), "_identity", ())
    if not identity:
        return MAIN
    return int(identity[0]) if len(identity) == 1 else os.getpid()


def claim_capture(run_dir: str | None, rank: int) -> bool:
    """True for the first process of ``rank`` to ask (its capture window is its own)."""
    if not run_dir:
        return True
    path = os.path.join(run_dir, f".capture-rank{rank}")
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    except OSError:
        return True  # an unwritable folder: as before, every process captures
    with os.fdopen(fd, "w") as f:
        f.write(str(os.getpid()))
    return True
