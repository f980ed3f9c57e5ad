"""Which multi-node job a launcher belongs to: the key its launchers share.

A job on N nodes has N launchers (`stepscope run` on each node, started by hand, by
`srun`, or by a cluster's job template), and they must all write into one run. Nothing
but the job itself ties them together, so each launcher derives the same key from what
it was given, strongest first:

1. ``stepscope run --run-group KEY``: the user says so;
2. Slurm: ``SLURM_JOB_ID`` (with ``SLURM_STEP_ID`` when present: one run per `srun`
   step), node rank ``SLURM_NODEID``;
3. a ``torchrun`` command with ``--nnodes`` above 1 (or a range ``MIN:MAX``): its
   rendezvous endpoint and id (torchrun's default id is ``none``, so the endpoint is part
   of the key), else its static ``--master-addr``/``--master-port``; node rank from
   ``--node-rank``. torchrun reads ``PET_*`` variables as defaults for its options, and so
   does this.

None of these: an ordinary run of one launcher, as always. Only the command line and
the environment are read (no torch import: the launcher stays light).
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# torchrun's options that take no value (everything else does, unless written --opt=value)
_TORCHRUN_FLAGS = frozenset(
    {"--standalone", "--no-python", "--no_python", "-m", "--module", "--run-path", "--run_path"}
)


@dataclass(frozen=True)
class RunGroup:
    """The key a multi-node job's launchers share, and this launcher's node in it."""

    key: str
    node_rank: int | None
    source: str  # 'option' | 'slurm' | 'torchrun'


def run_group_of(
    command: Sequence[str], env: Mapping[str, str], explicit: str | None = None
) -> RunGroup | None:
    """The group this launcher joins, or None for an ordinary run."""
    options = torchrun_options(command)
    node_rank = _int(_option(options, env, "node-rank"))
    if explicit is not None and explicit.strip():
        if node_rank is None:
            node_rank = _int(env.get("SLURM_NODEID"))
        return RunGroup(f"group:{explicit.strip()}", node_rank, "option")
    job = (env.get("SLURM_JOB_ID") or "").strip()
    if job:
        step = (env.get("SLURM_STEP_ID") or "").strip()
        key = f"slurm:{job}.{step}" if step else f"slurm:{job}"
        return RunGroup(key, _int(env.get("SLURM_NODEID")), "slurm")
    if options is None or _max_nodes(_option(options, env, "nnodes")) <= 1:
        return None
    endpoint = _option(options, env, "rdzv-endpoint")
    if not endpoint:
        addr, port = _option(options, env, "master-addr"), _option(options, env, "master-port")
        endpoint = f"{addr}:{port or 29500}" if addr else None
    if not endpoint:
        return None  # nothing the nodes are sure to share
    rdzv_id = _option(options, env, "rdzv-id") or "none"
    return RunGroup(f"torchrun:{endpoint}/{rdzv_id}", node_rank, "torchrun")


def torchrun_options(command: Sequence[str]) -> dict[str, str] | None:
    """torchrun's own options (``--rdzv_id`` read as ``rdzv-id``), or None if no torchrun.

    Recognises ``torchrun ...`` and ``python -m torch.distributed.run|launch ...``; the
    options end at the training script, so the script's own ``--nnodes`` is never read.
    """
    args = list(command)
    start = None
    for i, arg in enumerate(args):
        if Path(arg).name == "torchrun":
            start = i + 1
            break
        if (
            arg == "-m"
            and i + 1 < len(args)
            and args[i + 1]
            in (
                "torch.distributed.run",
                "torch.distributed.launch",
            )
        ):
            start = i + 2
            break
    if start is None:
        return None
    out: dict[str, str] = {}
    i = start
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-"):
            break  # the training script
        if arg == "--":
            break
        name, eq, value = arg.partition("=")
        key = name.lstrip("-").replace("_", "-")
        if eq:
            out[key] = value
        elif arg in _TORCHRUN_FLAGS:
            out[key] = ""
        elif i + 1 < len(args):
            out[key] = args[i + 1]
            i += 1
        i += 1
    return out


@dataclass
class Membership:
    """How this launcher is part of its run, and how it ends it.

    Alone (``member_id`` None), the launcher finalises the run itself. One of a group, it
    finishes its own member row; the store gives the run its final status (the worst of
    its members') when the last launcher ends, so a fast node never closes a run that
    another node is still writing to.
    """

    store: Any
    run_id: int
    created: bool = True
    member_id: int | None = None
    node_rank: int | None = None

    def finish(self, status: str, exit_code: int | None = None, error: str | None = None) -> bool:
        """End this launcher's part; True when that ended the run."""
        if self.member_id is None:
            self.store.finish_run(self.run_id, status, exit_code, error=error)
            return True
        return bool(
            self.store.finish_member(self.member_id, status, exit_code=exit_code, error=error)
        )


def join_or_create(
    store: Any,
    command: Sequence[str],
    group: RunGroup | None,
    **create_kwargs: Any,
) -> Membership:
    """Create the run (no group), or join the group's run, creating it if this is first.

    ``create_kwargs`` are ``RunStore.create_run``'s; its ``pid`` and ``pid_started_at``
    (this launcher's) are also the member's.
    """
    if group is None:
        return Membership(store, store.create_run(command, **create_kwargs))
    run_id, created = store.join_or_create_run(command, run_group=group.key, **create_kwargs)
    member_id = store.add_member(
        run_id,
        host=socket.gethostname(),
        pid=create_kwargs.get("pid"),
        pid_started_at=create_kwargs.get("pid_started_at"),
        node_rank=group.node_rank,
    )
    return Membership(store, int(run_id), bool(created), int(member_id), group.node_rank)


def _option(options: dict[str, str] | None, env: Mapping[str, str], name: str) -> str | None:
    """An option of torchrun's command line, else its PET_ variable (torchrun's default)."""
    if options is None:
        return None
    value = options.get(name)
    if value is None:
        value = env.get("PET_" + name.upper().replace("-", "_"))
    return value.strip() if value is not None and value.strip() else None


def _max_nodes(nnodes: str | None) -> int:
    """``2`` -> 2; a range ``1:4`` -> 4; unset or unreadable -> 1."""
    if not nnodes:
        return 1
    return _int(nnodes.split(":")[-1]) or 1


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return None
