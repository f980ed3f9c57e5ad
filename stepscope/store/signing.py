"""A run's signature: proof that this user's stepscope recorded what a replay would run.

Re-running a run (an experiment's trials, a batch sweep) starts its recorded command in
its recorded folder with its recorded variables. In a shared store anyone on the team can
write those columns, and the ``user`` and ``host`` beside them, so none of them can vouch
for the others. The recorder therefore signs them with its user's key
(``user_key.py``): an HMAC-SHA256 per field, keyed by the run's id, so that a refusal
can name the field that changed and a signature copied onto another row does not fit.
A replay runs only a row this user's key signed, and only the variables signed
(``REPLAYED_ENV``): a ``LD_PRELOAD`` written into a row is neither signed nor replayed.

The signature is kept as JSON in ``runs.signature``: ``{"v": 1, "key": <key id>,
"mac": {field: hex}}``. A run recorded before signing existed has none, and is refused
with the same kind of line; ``stepscope trust RUN`` signs it after its owner has seen it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

from stepscope.store.user_key import KeyFileError, key_id, user_key

VERSION = 1
# Environment variables that change how a PyTorch job performs or distributes itself:
# recorded with each run so that two runs can be compared (collectors/facts/env_summary.py).
# Nothing else from the environment is stored: it may hold secrets.
RECORDED_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_LAUNCH_BLOCKING",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NCCL_DEBUG",
    "NCCL_P2P_DISABLE",
    "NCCL_IB_DISABLE",
    "TORCH_DISTRIBUTED_DEBUG",
    "TORCHINDUCTOR_CACHE_DIR",
    "VIRTUAL_ENV",
    "CONDA_DEFAULT_ENV",
)
# Recorded variables that are about where the job ran, not how: not replayed.
NOT_REPLAYED = ("VIRTUAL_ENV", "CONDA_DEFAULT_ENV")
REPLAYED_ENV = tuple(k for k in RECORDED_ENV if k not in NOT_REPLAYED)
SIGNED_FIELDS = ("command", "cwd", "env", "user", "host")


def replayed_env(run: Mapping[str, Any]) -> dict[str, str]:
    """The recorded variables a replay of ``run`` sets: the allow-list, nothing else."""
    recorded = (_as_dict(run.get("env")) or {}).get("vars") or {}
    if not isinstance(recorded, Mapping):
        return {}
    return {k: str(recorded[k]) for k in REPLAYED_ENV if recorded.get(k) is not None}


def signed_values(run: Mapping[str, Any]) -> dict[str, Any]:
    """What the signature covers, read from a run row (as ``RunStore.run`` returns it)."""
    command = _as_list(run.get("command"))
    return {
        "command": [str(c) for c in command] if isinstance(command, list) else command,
        "cwd": _text(run.get("cwd")),
        "env": replayed_env(run),
        "user": _text(run.get("user")),
        "host": _text(run.get("host")),
    }


def sign(run_id: int, values: Mapping[str, Any], key: bytes | None = None) -> str:
    """The signature of ``values`` (``signed_values``) for run ``run_id``, as stored."""
    key = user_key() if key is None else key
    macs = {field: _mac(key, run_id, field, values.get(field)) for field in SIGNED_FIELDS}
    return json.dumps({"v": VERSION, "key": key_id(key), "mac": macs}, sort_keys=True)


def sign_run(run: Mapping[str, Any]) -> str:
    """``sign`` of a whole run row."""
    return sign(int(run["id"]), signed_values(run))


def signature_refusal(run: Mapping[str, Any]) -> str | None:
    """Why ``run``'s row is not one this user's stepscope recorded as it stands; None when
    its signature holds for every field a replay uses. One line naming the field and the
    reason, for callers to put after the run's name ("cannot optimize run 12: ...")."""
    run_id = run.get("id")
    trust = f"`stepscope trust {run_id}` signs it after showing you its command"
    raw = run.get("signature")
    if raw is None or (isinstance(raw, float) and raw != raw) or not str(raw).strip():
        return f"not signed (recorded before runs were signed, or not by stepscope); {trust}"
    try:
        stored = json.loads(str(raw))
        macs = stored["mac"]
        version, stored_key = stored["v"], str(stored["key"])
        if not isinstance(macs, dict):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        return f"its signature is not one stepscope writes; {trust}"
    if version != VERSION:
        return f"its signature is of version {version}, not {VERSION}; {trust}"
    try:
        key = user_key(create=False)
    except KeyFileError as exc:
        return f"its signature cannot be checked ({exc})"
    if stored_key != key_id(key):
        return (
            f"signed with another key ({stored_key}; yours is {key_id(key)}): "
            "recorded by someone else, or before your key changed"
        )
    values = signed_values(run)
    for field in SIGNED_FIELDS:
        expected = _mac(key, int(run_id), field, values.get(field))
        if not hmac.compare_digest(str(macs.get(field, "")), expected):
            return (
                f"its {field} does not match its signature "
                f"(the row was changed after it was recorded); {trust}"
            )
    return None


def _mac(key: bytes, run_id: int, field: str, value: Any) -> str:
    message = json.dumps([VERSION, int(run_id), field, value], sort_keys=True, default=str)
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()


def _text(value: Any) -> str | None:
    """A text column as the row holds it; pandas' NaN for NULL is None."""
    if value is None or (isinstance(value, float) and value != value):
        return None
    return str(value)


def _as_dict(value: Any) -> dict[str, Any] | None:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


def _as_list(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


__all__ = [
    "NOT_REPLAYED",
    "RECORDED_ENV",
    "REPLAYED_ENV",
    "KeyFileError",
    "replayed_env",
    "sign",
    "sign_run",
    "signature_refusal",
    "signed_values",
]
