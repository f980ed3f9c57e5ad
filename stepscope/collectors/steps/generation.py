"""The requests of a text-generation job: what one call of the model is part of.

A generation job calls its model once per new token: Hugging Face's ``generate()`` (and
so ``pipeline("text-generation")``), or a loop of the script's own (nanoGPT's
``GPT.generate``, the Llama reference code) that feeds the model a sequence one token
longer each time (no KV cache) or one new token with the cache of the others. Read as
forward steps, such a job is hundreds of tiny "requests". Here a *request* is one outer
call: a ``generate()`` call (``injob/generate_patch.py`` wraps it), or one run of a
hand-written loop over one prompt, found from the shapes of the token ids the model is
given:

* no KV cache: the next call's sequence is the last one plus one token (nanoGPT crops
  it at its block size: then it stays as long), same batch rows;
* a KV cache: a first call with the prompt, then calls of one token each.

Two calls make the pattern (a prefill, then one decode step); a call that does not
continue it ends the request, and so does the end of the job. Token ids are an integer
tensor of two dimensions, the model's first positional argument or its ``input_ids``
(``idx``, ``tokens``) keyword, called under no grad (generation never records
gradients; a length-sorted evaluation that happens to grow by one token does). On the
CPU the new sequence must also start with the previous one; on a GPU that would need a
device sync per token, so shapes alone decide there.

Per request: prompt tokens, new tokens (batch rows counted), time to the first token,
each later forward's position in the sequence, start and duration (the per-token
latency against position: its slope is the KV-cache evidence), prefill (the first
forward) and decode (the others) times, and the process's peak RSS (CUDA's max allocated
on a GPU) while it ran. Rows go to the store through the job's writer when a request
starts (status 'running') and when it ends, so a job killed mid-request leaves it
marked. Nothing here imports torch; the step timer (``generation_steps.py``) calls in.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

# Keyword names a model takes its token ids under (HF, nanoGPT, Llama reference code).
TOKEN_KWARGS = ("input_ids", "idx", "tokens")
# Per-forward timings kept per request: a request of more tokens keeps the first ones.
MAX_TOKEN_ROWS = 4096
# The generated tokens of a trial's first requests (the output guard's input).
TOKENS_FILE = "tokens.json"
TOKENS_KIND = "generated_tokens"
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def token_ids(torch: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> Any:
    """The token-id tensor of a model call (integer, two dimensions), or None."""
    candidates = [args[0]] if args else []
    if kwargs:
        candidates += [kwargs[k] for k in TOKEN_KWARGS if k in kwargs]
    for value in candidates:
        if (
            isinstance(value, torch.Tensor)
            and value.dim() == 2
            and not value.is_floating_point()
            and not value.is_complex()
            and value.dtype != torch.bool
        ):
            return value
    return None


def caller_frame() -> Any:
    """The frame that called the model: the first one outside torch's module call
    machinery and stepscope's hooks (a loop's ``generate`` method, or the script).

    A model's own ``forward`` called directly (the Llama reference code's
    ``self.model.forward(tokens, prev_pos)`` runs no hook of the model's: the first
    module call stepscope sees is its embedding's, from inside that ``forward``) is
    skipped too: its frame is new at every token, the loop's is not."""
    torch_dir = _torch_dir()
    frame = sys._getframe(1)
    while frame is not None and (
        frame.f_code.co_filename.startswith(torch_dir)  # module calls, no-grad decorators
        or "stepscope/collectors/" in frame.f_code.co_filename
        or _module_forward(frame)
    ):
        frame = frame.f_back
    return frame


def _torch_dir() -> str:
    """torch's package folder (its frames are the module call and decorator machinery)."""
    torch = sys.modules.get("torch")
    path = getattr(torch, "__file__", None)
    return os.path.dirname(path) + os.sep if path else "\0"


def _module_forward(frame: Any) -> bool:
    """A frame of an ``nn.Module``'s ``forward`` (its ``self`` has module hooks' tables)."""
    if frame.f_code.co_name != "forward":
        return False
    owner = frame.f_locals.get("self")
    return owner is not None and hasattr(owner, "_forward_pre_hooks")


def call_kwargs() -> dict[str, Any] | None:
    """The keyword arguments of the module call under way, read from torch's call frame
    (global forward pre-hooks are not given them); None where they cannot be read."""
    try:
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_code.co_filename.endswith("torch/nn/modules/module.py"):
                kwargs = frame.f_locals.get("kwargs")
                if isinstance(kwargs, dict):
                    return kwargs
            elif "stepscope/collectors/" not in frame.f_code.co_filename:
                return None
            frame = frame.f_back
    except Exception:
        return None
    return None


def rss_bytes() -> float | None:
    """This process's resident set now (Linux ``/proc/self/statm``; None elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return float(int(f.read().split()[1]) * _PAGE)
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class Request:
    """One request while it runs; ``row()`` is what the store keeps of it."""

    index: int
    source: str  # 'generate' | 'loop'
    start_unix: float
    start_perf: float
    rows: int
    prompt_len: int  # tokens per row in the prompt (the first call's sequence length)
    prompt_tokens: int
    model: Any = None  # the model whose calls are its forwards (a weak reference)
    meta: dict[str, Any] = field(default_factory=dict)
    # per forward: (position, start perf, seconds); the first one is the prefill
    forwards: list[tuple[int, float, float]] = field(default_factory=list)
    open_start: float | None = None  # perf time of a forward under way
    seq_len: int = 0  # the last call's sequence length (loops)
    mode: str | None = None  # 'nocache' | 'cache' (loops, once the second call told)
    frame: Any = None  # the loop's calling frame (held: its id stays unique while held)
    peak_rss: float | None = None
    peak_cuda: float | None = None
    end_perf: float | None = None
    new_tokens: int | None = None
    positions: int | None = None
    status: str = "running"
    profiled: bool = False
    grad: bool = False  # a forward ran under grad mode
    calls: int = 0  # forwards of other modules (a draft model) during the request
    # a loop's decoded tokens as its model saw them (only when the plan records tokens):
    # the last column of each call's ids after the prefill
    seen: list[Any] = field(default_factory=list)
    generated: list[list[int]] | None = None  # per row, for the output guard
    # the KV cache (``kv_cache.py``): a cache object the calls update in place, read at
    # the request's end (then let go), and the largest cache measured at a call (legacy
    # tuples, a first call's), whether one of those was allocated whole
    kv_cache: Any = None
    kv_bytes: int = 0
    kv_whole: bool = False

    def forward_started(self, position: int) -> None:
        self.open_start = perf_counter()
        self.forwards.append((position, self.open_start, 0.0))

    def forward_ended(self) -> None:
        if self.open_start is None or not self.forwards:
            return
        position, start, _ = self.forwards[-1]
        self.forwards[-1] = (position, start, perf_counter() - start)
        self.open_start = None
        rss = rss_bytes()
        if rss is not None and (self.peak_rss is None or rss > self.peak_rss):
            self.peak_rss = rss

    def forward_extended(self) -> None:
        """The last forward goes on to now (a top-level call after it, before the next)."""
        if self.forwards and self.open_start is None:
            position, start, _ = self.forwards[-1]
            self.forwards[-1] = (position, start, perf_counter() - start)

    def finish(self, status: str, new_tokens: int | None, positions: int | None) -> None:
        self.end_perf = perf_counter() if self.end_perf is None else self.end_perf
        self.status = status
        self.new_tokens = new_tokens
        self.positions = positions

    def ttft(self) -> float | None:
        """Start to the first new token: the prefill and picking its token, i.e. up to
        the second forward's start (or the end, when there was one forward)."""
        if len(self.forwards) >= 2:
            return self.forwards[1][1] - self.start_perf
        if self.end_perf is not None and self.forwards:
            return self.end_perf - self.start_perf
        return None

    def row(self, step: int | None = None) -> dict[str, Any]:
        end = self.end_perf
        prefill = self.forwards[0][2] if self.forwards else None
        decode = sum(f[2] for f in self.forwards[1:]) if len(self.forwards) > 1 else None
        tokens = [
            [pos, round(start - self.start_perf, 6), round(seconds, 6)]
            for pos, start, seconds in self.forwards[1 : MAX_TOKEN_ROWS + 1]
        ]
        return {
            "request": self.index,
            "step": step,
            "source": self.source,
            "status": self.status,
            "start_s": self.start_unix,
            "end_s": None if end is None else self.start_unix + (end - self.start_perf),
            "rows": self.rows,
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "positions": self.positions,
            "ttft_s": self.ttft(),
            "prefill_s": prefill,
            "decode_s": decode,
            "forwards": len(self.forwards),
            "peak_rss_bytes": self.peak_rss,
            "peak_cuda_bytes": self.peak_cuda,
            "profiled": self.profiled,
            "tokens": tokens,
            "meta": self.meta,
        }


class GenerationTracker:
    """The requests of one process: the one under way, and how the loop's calls go."""

    # Requests whose generated tokens an experiment's trial keeps (``record_outputs`` in
    # its plan): the output guard compares them between arms (``optim_runner``).
    record = 0
    tokens_path: str | None = None
    # A batch sweep's trials (``trials/generation_sweep.py``): prompts to record, or the sweep.
    record_prompts = 0
    sweep: dict[str, Any] | None = None
    run_dir: str | None = None

    def __init__(self) -> None:
        self.count = 0  # requests begun
        self.loops_seen = False  # a hand-written loop was confirmed in this job
        self.generate_seen = False
        self.current: Request | None = None  # a generate() call or a confirmed loop request
        self.tentative: Request | None = None  # a call that may be a loop's prefill
        self.generate_depth = 0
        self.generate_thread: int | None = None
        self.kept: list[dict[str, Any]] = []  # generated tokens of the first requests
        self.prompts: list[dict[str, Any]] = []  # recorded prompts (a capture trial)
        self.sweep_done = False

    def new_request(
        self, source: str, rows: int, prompt_len: int, prompt_tokens: int, **meta: Any
    ) -> Request:
        request = Request(
            index=self.count,
            source=source,
            start_unix=time.time(),
            start_perf=perf_counter(),
            rows=rows,
            prompt_len=prompt_len,
            prompt_tokens=prompt_tokens,
            meta={k: v for k, v in meta.items() if v is not None},
        )
        self.count += 1
        request.peak_rss = rss_bytes()
        return request

    # -- generated tokens, for the output guard -------------------------------------------
    def keep_tokens(self, request: Request) -> None:
        if request.generated is not None and len(self.kept) < self.record:
            self.kept.append({"request": request.index, "rows": request.generated})

    def save_tokens(self, writer: Any) -> None:
        """Write the kept tokens once, at the job's end, and list them as an artifact."""
        if not self.kept or not self.tokens_path:
            return
        import json  # local: a trial job's exit path only

        with open(self.tokens_path, "w", encoding="utf-8") as fh:
            json.dump({"requests": self.kept}, fh)
        writer.add_artifact(TOKENS_KIND, self.tokens_path, {"requests": len(self.kept)})
        self.kept = []

    # -- hand-written loops ---------------------------------------------------------------
    @staticmethod
    def continues(
        request: Request, rows: int, length: int, frame: Any, prefix_ok: bool | None
    ) -> str | None:
        """How a call of ``rows`` x ``length`` tokens goes on from the request's last one:
        'nocache' (one token longer, or as long at a crop), 'cache' (one token after the
        prompt or after a cached step), or None (it does not: another request or call)."""
        if rows != request.rows or prefix_ok is False:
            return None
        if request.frame is not None and frame is not request.frame:
            return None  # a new call of the loop's function: a new request
        last = request.seq_len
        if request.mode in (None, "nocache") and length == last + 1:
            return "nocache"
        if request.mode == "nocache" and length == last and len(request.forwards) > 2:
            return "nocache"  # cropped at the model's block size: as long as before
        if request.mode in (None, "cache") and length == 1 and (last > 1 or request.mode):
            return "cache"
        return None


def generate_meta(config: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The settings of a generate() call that the analysis reads (kwargs over config)."""
    names = (
        "max_new_tokens",
        "do_sample",
        "num_beams",
        "use_cache",
        "cache_implementation",
        "prompt_lookup_num_tokens",
        "num_return_sequences",
    )
    meta: dict[str, Any] = {}
    for name in names:
        value = kwargs.get(name, getattr(config, name, None))
        if isinstance(value, (bool, int, float, str)):
            meta[name] = value
    meta["assistant"] = kwargs.get("assistant_model") is not None or None
    meta["streamer"] = kwargs.get("streamer") is not None or None
    return meta


def count_new_tokens(torch: Any, request: Request, output: Any) -> tuple[int | None, int | None]:
    """(new tokens over all rows, the longest row's) from what generate() returned: each
    row up to and including its first end-of-sequence token (the rest is padding)."""
    sequences = getattr(output, "sequences", output)
    if not isinstance(sequences, torch.Tensor) or sequences.dim() != 2:
        return None, None
    model = request.model() if request.model is not None else None
    config = getattr(model, "config", None)
    skip = 1 if getattr(config, "is_encoder_decoder", False) else request.prompt_len
    request.rows = int(sequences.shape[0])  # the decode batch: num_return_sequences counted
    new = sequences[:, skip:].detach().cpu()
    if new.shape[1] == 0:
        request.generated = [[] for _ in range(new.shape[0])]
        return 0, 0
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    eos_ids = [eos] if isinstance(eos, int) else [int(e) for e in (eos or [])]
    width = new.shape[1]
    if eos_ids:
        is_eos = torch.isin(new, torch.tensor(eos_ids))
        lengths = torch.where(
            is_eos.any(dim=1), is_eos.int().argmax(dim=1) + 1, torch.full((new.shape[0],), width)
        )
    else:
        lengths = torch.full((new.shape[0],), width)
    request.generated = [row[: int(n)] for row, n in zip(new.tolist(), lengths, strict=True)]
    return int(lengths.sum()), int(lengths.max())


def reset_cuda_peak(torch: Any) -> None:
    """A request starts: CUDA's peak counter from here (nothing where CUDA is unused)."""
    with contextlib.suppress(Exception):
        if torch.cuda.is_initialized():
            torch.cuda.reset_peak_memory_stats()


def cuda_peak(torch: Any) -> float | None:
    """CUDA's most allocated since the request started; None where CUDA is unused."""
    with contextlib.suppress(Exception):
        if torch.cuda.is_initialized():
            return float(torch.cuda.max_memory_allocated())
    return None
