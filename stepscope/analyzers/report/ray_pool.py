"""Per-rank work on a Ray cluster: ``map_on_ray(address, fn, calls)``.

A 1,000-rank job's traces do not fit one machine's memory or patience, so
``analyze_trace(..., ray_address=...)`` hands each rank to a Ray task. This module is the
only one that knows Ray; it is imported lazily (``pip install 'stepscope[ray]'``), so the
CLI and the analyzers start without it.

A task reads its own source (a shared path or an ``s3://`` URI) where it runs, so nothing
but the small per-rank result travels through this process. To read S3 as this process
does, a task gets this process's ``AWS_*`` variables for the length of its call: put once
in the object store and handed over as an argument, never in a runtime_env (Ray's agents
log those) and never in a message. ``fn`` must be importable on the cluster (stepscope
installed on its nodes); a module-level function is pickled by reference.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

from stepscope.errors import one_line_error

T = TypeVar("T")

MISSING_RAY = "--ray needs Ray: pip install 'stepscope[ray]'"
# Ray waits minutes (20 tries of its GCS client) on an address nobody listens on;
# a TCP connect says so in seconds.
CONNECT_TIMEOUT_S = 5.0
# How long a failed map waits for its other tasks to end (cancelled, mostly at once).
SETTLE_S = 10.0
# The prefix of the variables a task inherits (credentials, region, endpoint,
# config files: what s3fs/botocore read, see store/artifacts.py).
TASK_ENV_PREFIX = "AWS_"

_connected_to: str | None = None  # the address this module connected Ray to, if it did


class RayPoolError(RuntimeError):
    """Ray is missing, the cluster cannot be reached, or it lost a task; one line."""


def map_on_ray(address: str, fn: Callable[..., T], calls: Sequence[tuple]) -> list[T]:
    """fn(*args) for each args tuple, as Ray tasks on the cluster at ``address``; results in order.

    ``address`` as Ray takes it: ``"auto"``, ``"host:6379"``, ``"ray://host:10001"``. A
    connection this process already has (the caller's own ``ray.init``) is used as it is.
    An exception raised by ``fn`` reaches the caller as itself (type and message), not
    as Ray's wrapper; the remaining tasks are cancelled.
    """
    ray = _ray()
    if not calls:
        return []
    _connect(ray, address)
    env = {k: v for k, v in os.environ.items() if k.startswith(TASK_ENV_PREFIX)}
    env_ref = ray.put(env)
    name = getattr(fn, "__qualname__", "task")
    task = ray.remote(_call_with_env).options(name=f"stepscope:{name}")
    refs = [task.remote(env_ref, fn, tuple(args)) for args in calls]
    try:
        return ray.get(refs)
    except BaseException as exc:
        for ref in refs:
            with contextlib.suppress(Exception):  # finished, or gone: nothing to cancel
                ray.cancel(ref)
        if isinstance(exc, ray.exceptions.RayError):
            _settle(ray, refs)
        error = _unwrapped(ray, exc, address)
        if error is exc:
            raise
        raise error from exc


def _settle(ray: Any, refs: list[Any]) -> None:
    """Read every task's outcome (briefly): Ray logs an error nobody read ("Unhandled
    error" and the remote traceback) on the user's terminal when its ref is released."""
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=SETTLE_S)
    for ref in ready:
        with contextlib.suppress(Exception):
            ray.get(ref)


def _call_with_env(env: dict[str, str], fn: Callable[..., T], args: tuple) -> T:
    """In the task: ``fn(*args)`` with the caller's variables, restored afterwards, since
    a Ray worker process runs other tasks (other users' jobs) after this one."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return fn(*args)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _ray() -> Any:
    try:
        import ray  # local: an optional extra, only for --ray
    except ImportError:
        raise RayPoolError(MISSING_RAY) from None
    return ray


def _connect(ray: Any, address: str) -> None:
    """Connect once; again only when this module's connection was to another address."""
    global _connected_to
    if ray.is_initialized():
        if _connected_to is None or _connected_to == address:
            return
        ray.shutdown()
        _connected_to = None
    _check_reachable(address)
    try:
        # WARNING: no "Connecting to existing Ray cluster" lines; the tasks' output stays
        # in the cluster's logs, not on the user's terminal.
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    except Exception as exc:
        raise RayPoolError(
            f"Ray cluster at {address}: cannot connect ({one_line_error(type(exc), exc)})"
        ) from None
    _connected_to = address


def _check_reachable(address: str) -> None:
    """Fail in seconds, naming the address, where nothing listens at an explicit host:port
    ("auto" is Ray's to resolve, and it says at once when there is no cluster)."""
    rest = address.split("://", 1)[1] if "://" in address else address
    try:
        parts = urlsplit(f"//{rest}")
        host, port = parts.hostname, parts.port
    except ValueError:
        raise RayPoolError(f"Ray cluster at {address}: not an address (host:port)") from None
    if not host or port is None:
        return
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise RayPoolError(f"Ray cluster at {address}: unreachable ({why})") from None


def _unwrapped(ray: Any, exc: BaseException, address: str) -> BaseException:
    """The task's own exception for a RayTaskError; one line for Ray's own failures
    (a worker killed, a node lost); anything else (Ctrl-C) as it is."""
    errors = ray.exceptions
    if isinstance(exc, errors.RayTaskError):
        cause = getattr(exc, "cause", None)
        if isinstance(cause, BaseException) and not isinstance(cause, errors.RayError):
            return cause
    if isinstance(exc, errors.RayError):
        line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return RayPoolError(f"Ray cluster at {address}: {type(exc).__name__}: {line}"[:500])
    return exc
