"""Requests as steps: where the step timer meets a text-generation job.

In a generation job one step is one request (``generation.py`` says what a request is),
never one forward: the forwards inside a request are its tokens. A ``generate()`` call
begins and ends its request itself (``injob/generate_patch.py``); a hand-written loop's request
ends where a call of the model stops continuing it, or with the job.

A hand-written loop is found on its second call. Its first call (the prefill) is held
back like a forward whose kind is not known yet: when the second call continues it, the
held row is taken back into the request; when it does not, the held row is written as
the ordinary forward step it was, at its own end. Only jobs with no optimizer and no
backward, calling their model under no grad, are read this way: a training job's
generate calls (a Trainer's generation evaluation) are recorded as requests but do not
make steps.

A step detector of ``StepTimer`` (``step_timer.py``): it works on the timer's shared
``StepState`` and its ``StepAccounting``, and is called by ``ForwardSteps`` at each
top-level call; what only it uses is its own.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from typing import Any

from stepscope.collectors.steps.forward_steps import ForwardSteps
from stepscope.collectors.steps.generation import (
    GenerationTracker,
    Request,
    call_kwargs,
    caller_frame,
    count_new_tokens,
    cuda_peak,
    generate_meta,
    reset_cuda_peak,
    token_ids,
)
from stepscope.collectors.steps.kv_cache import (
    allocated_whole,
    cache_figures,
    cache_of,
    cache_tensors,
    held_bytes,
    is_cache_object,
)
from stepscope.collectors.steps.step_accounting import StepAccounting, StepLimitReached
from stepscope.collectors.steps.step_state import StepState
from stepscope.collectors.trials.generation_sweep import record_prompt, save_prompts


class GenerationSteps:
    """Requests of generate() calls and of hand-written decode loops, as steps."""

    def __init__(self, state: StepState, accounting: StepAccounting, forward: ForwardSteps) -> None:
        self.state = state
        self.acc = accounting
        self.forward = forward  # its anchor module and its held forwards
        self.gen = GenerationTracker()  # the requests (the bootstrap sets what to record)
        self._held: dict[str, Any] | None = None  # the tentative prefill's row
        self._ids: Any = None  # the last call's token ids (CPU prefix check)

    # -- generate() -----------------------------------------------------------------------
    def begin_generate(self, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A generate() call starts: its request (None when nested or not recorded)."""
        gen = self.gen
        if self.state.inert or "generation" in self.state.disabled:
            return None
        if gen.generate_depth:
            gen.generate_depth += 1  # an assistant model's generate inside: the same request
            return None
        try:
            self._end_loop_request(at_last_forward=False)
            if self.state.start_s is None:
                self.acc.activity()
            ids = kwargs.get("input_ids")
            if ids is None:
                ids = kwargs.get("inputs", args[0] if args else None)
            torch = self.state.torch
            shape = tuple(ids.shape) if isinstance(ids, torch.Tensor) and ids.dim() == 2 else ()
            rows, length = (int(shape[0]), int(shape[1])) if shape else (1, 0)
            prompt = rows * length
            mask = kwargs.get("attention_mask")
            if isinstance(mask, torch.Tensor) and mask.is_cpu and mask.dim() == 2:
                prompt = int(mask.sum())  # padding left out (on a GPU: counted, no sync)
            config = getattr(model, "generation_config", None)
            request = gen.new_request(
                "generate", rows, length, prompt, **generate_meta(config, kwargs)
            )
            request.model = weakref.ref(model)
            request.profiled = bool(self.state.profiled)
            if gen.record_prompts > len(gen.prompts):
                gen.prompts.append(record_prompt(self.state.torch, args, kwargs))
            reset_cuda_peak(self.state.torch)
            gen.generate_depth = 1
            gen.generate_thread = threading.get_ident()
            gen.generate_seen = True
            gen.current = request
            self.state.writer().add_request(request.row())
            return request
        except Exception as exc:
            self.acc.disable("generation", exc)
            gen.generate_depth = 0
            return None

    def note_generate_settings(self, request: Any, model: Any, kwargs: dict[str, Any]) -> None:
        """The call's settings once the plan's fixes changed them (a trial's requests say
        what they ran with: a static cache, prompt lookup)."""
        with contextlib.suppress(Exception):
            config = getattr(model, "generation_config", None)
            request.meta.update(generate_meta(config, kwargs))

    def end_generate(self, request: Any, output: Any, error: BaseException | None) -> None:
        """The generate() call returned (or raised): its tokens, its row, its step."""
        gen = self.gen
        if request is None:
            gen.generate_depth = max(0, gen.generate_depth - 1)
            return
        gen.generate_depth = 0
        gen.current = None
        try:
            if error is not None:
                request.meta["error"] = f"{type(error).__name__}: {error}"[:300]
                request.finish("error", None, None)
            else:
                counted = count_new_tokens(self.state.torch, request, output)
                request.finish("done", *counted)
            self._close_request(request, time.time(), stop=error is None)
        except StepLimitReached:
            raise
        except Exception as exc:
            self.acc.disable("generation", exc)

    def _in_generate(self) -> Request | None:
        gen = self.gen
        if gen.generate_depth and gen.generate_thread == threading.get_ident():
            return gen.current
        return None

    # -- the hooks' side -------------------------------------------------------------------
    def pre(self, module: Any, args: tuple[Any, ...]) -> bool:
        """At a top-level call: True when it is a forward of a request (then no step
        may end at its end)."""
        if "generation" in self.state.disabled:
            return False
        try:
            request = self._in_generate()
            if request is not None:
                model = request.model() if request.model is not None else None
                if module is model:
                    request.forward_started(request.prompt_len + len(request.forwards))
                    request.grad = request.grad or self.state.torch.is_grad_enabled()
                else:
                    request.calls += 1
                return True
            if self.gen.generate_depth:
                return False  # another thread's call while generate() runs
            return self._loop_pre(module, args)
        except StepLimitReached:
            raise
        except Exception as exc:
            self.acc.disable("generation", exc)
            return False

    def post(self, module: Any, output: Any = None) -> bool:
        """At the end of a top-level call: True when it was a request's forward."""
        if "generation" in self.state.disabled:
            return False
        try:
            request = self._in_generate()
            if request is not None:
                model = request.model() if request.model is not None else None
                if module is model:
                    request.forward_ended()
                    self._note_cache(request, output)
                return True
            gen = self.gen
            loop = gen.tentative or (gen.current if gen.current is not None else None)
            if loop is None:
                return False
            if loop.open_start is None:
                # another top-level call after the token's: a model whose forward is
                # called directly (no hook of its own) shows its layers one by one, the
                # first of them the anchor; the token's forward lasts to the last of them
                loop.forward_extended()
                return False
            loop.forward_ended()
            self._note_cache(loop, output)
            if loop is gen.tentative:
                # held back until the next call tells what it was
                self._held = self.acc.take_row("forward", time.time())
                self._held["_grad"] = False
                self.state.start_s = self._held["end_s"]
            return True
        except Exception as exc:
            self.acc.disable("generation", exc)
            return False

    # -- hand-written loops -----------------------------------------------------------------
    def _loop_pre(self, module: Any, args: tuple[Any, ...]) -> bool:
        gen = self.gen
        torch = self.state.torch
        if (
            self.state.mode != "auto"
            or self.state.backward_seen
            or self.state.optimizers_made
            or torch.is_grad_enabled()
        ):
            self._end_loop_request(at_last_forward=False)
            return False
        anchor = self.forward.anchor()
        if anchor is not None and module is not anchor:
            return False  # a loss or post-processing module: part of the call before it
        ids = token_ids(torch, args, None) if args else None
        if ids is None:
            ids = token_ids(torch, (), call_kwargs())
        if ids is None:
            self._end_loop_request(at_last_forward=False)
            return False
        rows, length = int(ids.shape[0]), int(ids.shape[1])
        frame = caller_frame()
        loop = gen.tentative or gen.current
        if loop is not None and loop.source == "loop":
            prefix = self._prefix_matches(ids)
            mode = gen.continues(loop, rows, length, frame, prefix)
            if mode is not None:
                if loop is gen.tentative:
                    self._confirm_loop(loop)
                loop.mode = mode
                loop.seq_len = length
                position = length if mode == "nocache" else loop.prompt_len + len(loop.forwards)
                loop.forward_started(position)
                self._ids = ids
                if gen.record > len(gen.kept):
                    loop.seen.append(ids[:, -1:].detach())
                return True
            self._end_loop_request(at_last_forward=False)
        site = f"{frame.f_code.co_name} ({frame.f_code.co_filename}:{frame.f_lineno})"
        request = gen.new_request("loop", rows, length, rows * length, site=site)
        request.frame = frame
        request.seq_len = length
        request.model = weakref.ref(module)
        request.profiled = bool(self.state.profiled)
        if gen.loops_seen:
            self._start_loop_request(request)  # its row first: not inside its prefill's time
        else:
            gen.tentative = request
        request.forward_started(length)
        self._ids = ids
        return True

    def _prefix_matches(self, ids: Any) -> bool | None:
        """Does the new sequence start with the last one (crops: shifted by one)? Only
        where both are on the CPU: on a GPU the comparison would sync the device."""
        last = self._ids
        if last is None or not (ids.is_cpu and last.is_cpu) or ids.shape[0] != last.shape[0]:
            return None
        n, m = int(ids.shape[1]), int(last.shape[1])
        with contextlib.suppress(Exception):
            if n == m + 1:
                return bool(self.state.torch.equal(ids[:, :m], last))
            if n == m and n > 1:
                return bool(self.state.torch.equal(ids[:, :-1], last[:, 1:]))
            if n == 1:
                return None  # a cached step: only its new token is given
        return False

    def _confirm_loop(self, request: Request) -> None:
        """The second call continued the first: a decode loop, and the first call (held
        back as a forward step) is the request's prefill."""
        gen = self.gen
        gen.tentative = None
        gen.loops_seen = True
        held, self._held = self._held, None
        if held is not None:
            self.acc.merge_row(held)
        self._start_loop_request(request)

    def _start_loop_request(self, request: Request) -> None:
        self.gen.current = request
        reset_cuda_peak(self.state.torch)
        self.state.writer().add_request(request.row())

    def _end_loop_request(self, at_last_forward: bool) -> None:
        """The loop's request (or its tentative first call) ends before the call under way
        (or at the job's end: ``at_last_forward``, where the step ends with its last
        forward, not with whatever the script did after)."""
        gen = self.gen
        if gen.tentative is not None:
            tentative, gen.tentative = gen.tentative, None
            held, self._held = self._held, None
            if held is not None:
                # the ordinary forward step it was: counted as one (no grad: see _loop_pre)
                module = tentative.model() if tentative.model is not None else None
                self.state.facts.on_forward_step(module, False, self.state.backward_seen)
                if at_last_forward:
                    self.acc.emit(held)
                else:
                    self.acc.release([held])
        request = gen.current
        if request is None or request.source != "loop":
            return
        gen.current = None
        self._ids = None
        if request.forwards:
            position, start, seconds = request.forwards[-1]
            request.end_perf = start + seconds
        request.finish("done", len(request.forwards) * request.rows, len(request.forwards))
        request.meta["kv_cache"] = request.mode == "cache"
        if request.seen:
            # the tokens its calls were fed after the prefill: all it generated but the last
            request.generated = self.state.torch.cat(request.seen, dim=1).cpu().tolist()
            request.seen = []
        end = request.start_unix + (request.end_perf - request.start_perf)
        self._close_request(request, end if at_last_forward else time.time(), stop=True,
                            final=at_last_forward)  # fmt: skip

    def _close_request(self, request: Request, end: float, stop: bool, final: bool = False) -> None:
        """Write the request's row and, in a job read as forward steps, its step."""
        request.peak_cuda = cuda_peak(self.state.torch)
        self._read_cache(request)
        self.gen.keep_tokens(request)
        self.state.facts.on_forward_step(
            request.model() if request.model is not None else None,
            request.grad,
            self.state.backward_seen,
        )
        writer = self.state.writer()
        if self.state.mode != "auto" or self.state.optimizers_made or self.state.backward_seen:
            writer.add_request(request.row())  # a training job's generation: no step
            return
        if self.forward.pending:
            self.forward.confirm_forward_steps()
        row = self.acc.take_row("generate", end)
        row["batch_size"] = request.rows
        step = self.state.step
        self.acc.emit(row)
        writer.add_request(request.row(step))
        if final:
            return
        if stop:
            self.acc.after_emit(end)
        else:
            self.state.start_s = time.time()

    def finalize(self) -> None:
        """At the job's end: the loop request under way ends with its last forward; a
        generate() call under way (the job is dying inside it) stays 'running'."""
        with contextlib.suppress(Exception):
            self._end_loop_request(at_last_forward=True)
        try:
            self.gen.save_tokens(self.state.writer())
            if self.gen.prompts and self.gen.run_dir:
                save_prompts(self.gen.prompts, self.gen.run_dir, self.state.writer())
                self.gen.prompts = []
        except Exception as exc:
            self.acc.disable("generated tokens", exc)

    # -- memory -------------------------------------------------------------------------------
    def _note_cache(self, request: Request, output: Any) -> None:
        """A request's forward returned a cache: one the calls update in place is read at
        the request's end; a legacy tuple, or a first call's (an inference job's forward
        returns one too), is measured now: held, it would outlive the job's reference."""
        if output is None or "kv cache" in self.state.disabled:
            return
        try:
            cache = cache_of(output)
            if cache is None:
                return
            if is_cache_object(cache) and request is not self.gen.tentative:
                request.kv_cache = cache
                return
            found = held_bytes(cache_tensors(cache, self.state.torch))
            request.kv_bytes = max(request.kv_bytes, found)
            request.kv_whole = request.kv_whole or allocated_whole(cache)
        except Exception as exc:
            self.acc.disable("kv cache", exc)

    def _read_cache(self, request: Request) -> None:
        """The request's KV cache at its end, in its meta: the bytes, and the positions
        per row it covers (prompt and decoded tokens but the last)."""
        cache, request.kv_cache = request.kv_cache, None  # never held past the request
        if "kv cache" in self.state.disabled:
            return
        try:
            # the modules called at top level: the model, or, where the script calls its
            # model's forward directly (Meta's Llama reference), each of its layers
            roots = [ref() for ref in list(self.forward._outer_modules.values())]
            if request.model is not None:
                roots.append(request.model())
            figures = cache_figures(
                cache, request.kv_bytes, roots, self.state.torch, whole=request.kv_whole
            )
            if figures is not None:
                context = request.prompt_len + max(len(request.forwards) - 1, 0)
                request.meta.update(figures, kv_cache_context=context)
        except Exception as exc:
            self.acc.disable("kv cache", exc)
