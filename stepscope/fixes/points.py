"""Where fixes act inside the job: the calls the installer intercepts, as seen by a fix.

The installer (``install.py``) wraps a few constructors the script calls anyway (the
DataLoader, DDP, the first top-level call of the model) and sets global switches. Several
fixes act at the same point (four of them change one DataLoader call), so the point is
the installer's and each fix gets an object for the call under way: it reads what the
script passed and says what it wants changed; the installer applies, reads back and
logs. Nothing here imports torch: these objects are built inside the job, after torch.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Change:
    """What a fix did (or why not), for the run's log and ``config["applied"]``.

    ``verified``: the job's own object read back shows the new value (None: nothing to
    read back). ``changed``: False when the setting already had the value, so a second
    application (at the model's first call) is not logged again.
    """

    text: str
    applied: bool = True
    verified: bool | None = None
    changed: bool = True


@dataclass
class LoaderCall:
    """One ``DataLoader(...)`` call: its arguments, and the changes fixes ask for.

    ``want`` replaces a value, unless the script set it explicitly and the plan keeps
    explicit values (``--keep-explicit``); each change is logged with what it replaced.
    """

    fix: str  # the fix acting now (set by the installer before each fix)
    params: dict[str, Any]  # the bound arguments (what the loader will be built with)
    explicit: set[str]  # the names the script passed itself
    signature: inspect.Signature
    override: bool  # replace explicit values (the plan's override_explicit)
    iterable: bool  # the dataset is an IterableDataset
    changes: list[tuple[str, str, bool, str | None]] = field(default_factory=list)

    @property
    def workers(self) -> int:
        return int(self.params.get("num_workers", 0) or 0)

    def want(self, name: str, value: Any) -> None:
        current = self.params.get(name, self.signature.parameters[name].default)
        if current == value:
            self.changes.append((self.fix, f"{name} is already {value!r}", True, name))
            return
        if name in self.explicit and not self.override:
            self.refuse(f"kept the job's {name}={current!r} (set explicitly; --keep-explicit)")
            return
        self.params[name] = value
        origin = f"the job set {current!r}" if name in self.explicit else "torch's default"
        self.changes.append((self.fix, f"{name} {current!r} -> {value!r} ({origin})", True, name))

    def set(self, name: str, value: Any, text: str) -> None:
        """Change a value the fix itself is about (a larger batch): no explicit check."""
        self.params[name] = value
        self.changes.append((self.fix, text, True, name))

    def refuse(self, why: str) -> None:
        self.changes.append((self.fix, f"not applied: {why}", False, None))


@dataclass
class ModelCall:
    """The model's first top-level call: the module, its inputs, and how to wrap it.

    Fixes change the module in place (compile its forward, convert its weights) and ask
    for the forward to be wrapped (``channels_last`` inputs, ``autocast_dtype``); the
    installer wraps once, after all model fixes, and enters autocast for this first call,
    which is already under way.
    """

    fix: str
    module: Any  # what the script calls (a DDP wrapper included)
    inner: Any  # the model itself (``module.module`` under DDP / DataParallel)
    device: Any
    args: tuple[Any, ...]
    torch: Any
    new_args: tuple[Any, ...] | None = None
    channels_last: bool = False
    autocast_dtype: Any = None
    autocast_ctx: Any = None  # entered for this first call; the installer exits it
    changes: list[tuple[str, Change]] = field(default_factory=list)

    def record(self, change: Change) -> None:
        self.changes.append((self.fix, change))


def to_channels_last(value: Any, torch: Any) -> Any:
    """4-D tensors in NHWC; anything else as it is."""
    if isinstance(value, torch.Tensor) and value.dim() == 4:
        return value.contiguous(memory_format=torch.channels_last)
    return value


def wrapped_forward(
    forward: Callable[..., Any], torch: Any, channels_last: bool, dtype: Any, device: str
) -> Callable[..., Any]:
    """The model's forward with its inputs in NHWC and under autocast, as the model fixes
    asked (``ModelCall.channels_last``, ``autocast_dtype``); the installer wraps once."""

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if channels_last:
            args = tuple(to_channels_last(a, torch) for a in args)
        if dtype is not None:
            with torch.autocast(device, dtype=dtype):
                return forward(*args, **kwargs)
        return forward(*args, **kwargs)

    wrapped.__wrapped__ = forward  # type: ignore[attr-defined]
    return wrapped


__all__ = ["Change", "LoaderCall", "ModelCall", "to_channels_last", "wrapped_forward"]
