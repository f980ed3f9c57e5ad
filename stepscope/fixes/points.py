"""Where fixes act inside the job: the calls the installer intercepts, as seen by a fix.

The installer (``install.py``) wraps a few constructors the script calls anyway (the
DataLoader, DDP, the first top-level call of the model, every outer ``generate()``
call) and sets global switches. Several
fixes act at the same point (four of them change one DataLoader call), so the point is
the installer's and each fix gets an object for the call under way: it reads what the
script passed and says what it wants changed; the installer applies, reads back and
logs. Nothing here imports torch: these objects are built inside the job, after torch.
"""

from __future__ import annotations

import contextlib
import copy
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
        # whose value it was: the job's, or torch's default (said with the value, so that
        # "0 -> 4 (torch's default)" is never read as 4 being the default)
        origin = (
            f"the job set {current!r}"
            if name in self.explicit
            else f"{current!r} was torch's default"
        )
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
    # the installer's recorder (fix id, change), for what a fix learns only later in
    # the job (a probe at a block's first call); None: kept in ``changes``
    report: Callable[[str, Change], None] | None = None

    def record(self, change: Change) -> None:
        self.changes.append((self.fix, change))

    def record_later(self) -> Callable[[Change], None]:
        """A recorder bound to the fix under way, for a change known after this call's
        hooks return (by then ``changes`` has been written)."""
        fix, report = self.fix, self.report
        if report is None:
            return lambda change: self.changes.append((fix, change))
        return lambda change: report(fix, change)


@dataclass
class GenerateCall:
    """One outer ``generate()`` call (Hugging Face's ``GenerationMixin``): the model, the
    keyword arguments it is about to get, and the changes fixes ask for.

    ``want`` sets an argument of the call (a static cache, prompt lookup, a draft model),
    unless the script passed it itself and the plan keeps explicit values; ``record``
    logs a change a fix made to the model (its attention implementation). The installer
    reads each wanted argument back from the keyword arguments it hands to ``generate()``
    and checks that this transformers takes it (``GenerationConfig.update`` would return
    an unknown name unused), then records each change once for the whole job.
    """

    fix: str  # the fix acting now (set by the installer before each fix)
    model: Any
    kwargs: dict[str, Any]  # what generate() will be called with (changed in place)
    explicit: set[str]  # the names the script passed itself
    rows: int | None  # prompt rows of this call (None: not readable)
    override: bool  # replace explicit values (the plan's override_explicit)
    torch: Any
    state: dict[str, Any] = field(default_factory=dict)  # the fix's own, across calls
    new_model: bool = True  # the first call of this model this fix sees
    changes: list[tuple[str, Change, str | None]] = field(default_factory=list)

    def setting(self, name: str) -> Any:
        """What generate() will use: the call's argument, else the model's generation
        config (its defaults, or what the script set on it)."""
        if name in self.kwargs:
            return self.kwargs[name]
        config = self.kwargs.get("generation_config") or getattr(
            self.model, "generation_config", None
        )
        return getattr(config, name, None)

    @property
    def greedy(self) -> bool:
        """No sampling, one beam: the tokens are the argmax at every step."""
        return not self.setting("do_sample") and int(self.setting("num_beams") or 1) == 1

    def want(self, name: str, value: Any, shown: str | None = None) -> None:
        """Call generate() with ``name=value`` (``shown``: how to write the value)."""
        text = shown if shown is not None else repr(value)
        current = self.setting(name)
        if current is value or (isinstance(value, str | int | float) and current == value):
            self.changes.append((self.fix, Change(f"{name} is already {text}"), None))
            return
        if name in self.explicit and not self.override:
            self.refuse(f"kept the call's {name}={current!r} (set explicitly; --keep-explicit)")
            return
        self.kwargs[name] = value
        origin = f"the call set {current!r}" if name in self.explicit else "not set by the job"
        self.changes.append((self.fix, Change(f"generate({name}={text}) ({origin})"), name))

    def record(self, change: Change) -> None:
        self.changes.append((self.fix, change, None))

    def refuse(self, why: str) -> None:
        self.changes.append((self.fix, Change(f"not applied: {why}", applied=False), None))

    def reads_back(self, name: str) -> bool:
        """The argument is in what generate() gets, and this transformers takes it: a
        parameter of ``generate`` (``assistant_model``), or a generation-config field
        (``GenerationConfig.update`` returns the names it does not know)."""
        if name not in self.kwargs:
            return False
        with contextlib.suppress(TypeError, ValueError):
            if name in inspect.signature(type(self.model).generate).parameters:
                return True
        config = getattr(self.model, "generation_config", None)
        if config is None:
            return False
        probe = copy.deepcopy(config)
        return name not in (probe.update(**{name: self.kwargs[name]}) or {})


def prompt_rows(args: tuple[Any, ...], kwargs: dict[str, Any], torch: Any) -> int | None:
    """Rows of a generate() call's prompt (``input_ids``, ``inputs``, the first positional
    argument or ``inputs_embeds``); None where none is a tensor."""
    for value in (kwargs.get("input_ids"), kwargs.get("inputs"), *args[:1]):
        if isinstance(value, torch.Tensor) and value.dim() in (1, 2):
            return 1 if value.dim() == 1 else int(value.shape[0])
    embeds = kwargs.get("inputs_embeds")
    return int(embeds.shape[0]) if isinstance(embeds, torch.Tensor) else None


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


@contextlib.contextmanager
def global_module_hooks_off(torch: Any) -> Any:
    """Fixes may call modules (quantisation's observers): the step timer's global hooks
    must not take those calls for the job's (an observer would become the step's anchor)."""
    module_mod = torch.nn.modules.module
    tables = [module_mod._global_forward_pre_hooks, module_mod._global_forward_hooks]
    saved = [dict(table) for table in tables]
    for table in tables:
        table.clear()
    try:
        yield
    finally:
        for table, entries in zip(tables, saved, strict=True):
            table.update(entries)


__all__ = [
    "Change",
    "GenerateCall",
    "LoaderCall",
    "ModelCall",
    "global_module_hooks_off",
    "prompt_rows",
    "to_channels_last",
    "wrapped_forward",
]
