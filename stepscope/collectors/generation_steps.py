"""Requests as steps: where the step timer meets a text-generation job.

In a generation job one step is one request (``generation.py`` says what a request is),
never one forward: the forwards inside a request are its tokens. A ``generate()`` call
begins and ends its request itself (``generate_patch.py``); a hand-written loop's request
ends where a call of the model stops continuing it, or with the job.

A hand-written loop is found on its second call. Its first call (the prefill) is held
back like a forward whose kind is not known yet: when the second call continues it, the
held row is taken back into the request; when it does not, the held row is written as
the ordinary forward step it was, at its own end. Only jobs with no optimizer and no
backward, calling their model under no grad, are read this way: a training job's
generate calls (a Trainer's generation evaluation) are recorded as requests but do not
make steps.

Methods of ``StepTimer`` (``step_timer.py``); ``_init_generation`` sets up their state.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from typing import Any

from stepscope.collectors.generation import (
    GenerationTracker,
    Request,
    call_kwargs,
    caller_frame,
    count_new_tokens,
    generate_meta,
    token_ids,
)
from stepscope.collectors.generation_sweep import record_prompt, run_batches, save_prompts
from stepscope.collectors.step_accounting import StepLimitReached
from stepscope.collectors.step_row import add_phases


class GenerationSteps:
    """Requests of generate() calls and of hand-written decode loops, as steps."""

    def _init_generation(self) -> None:
        self.gen = GenerationTracker()
        self._gen_held: dict[str, Any] | None = None  # the tentative prefill's row
        self._gen_ids: Any = None  # the last call's token ids (CPU prefix check)

    # -- generate() -----------------------------------------------------------------------
    def begin_generate(self, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A generate() call starts: its request (None when nested or not recorded)."""
        gen = self.gen
        if self.inert or "generation" in self._disabled:
            return None
        if gen.generate_depth:
            gen.generate_depth += 1  # an assistant model's generate inside: the same request
            return None
        try:
            self._end_loop_request(at_last_forward=False)
            if self.start_s is None:
                self._activity()
            ids = kwargs.get("input_ids")
            if ids is None:
                ids = kwargs.get("inputs", args[0] if args else None)
            torch = self._torch
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
            request.profiled = bool(self.profiled)
            if gen.record_prompts > len(gen.prompts):
                gen.prompts.append(record_prompt(self._torch, args, kwargs))
            self._reset_cuda_peak()
            gen.generate_depth = 1
            gen.generate_thread = threading.get_ident()
            gen.generate_seen = True
            gen.current = request
            self._writer().add_request(request.row())
            return request
        except Exception as exc:
            self._disable("generation", exc)
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
                counted = count_new_tokens(self._torch, request, output)
                request.finish("done", *counted)
            self._close_request(request, time.time(), stop=error is None)
        except StepLimitReached:
            raise
        except Exception as exc:
            self._disable("generation", exc)

    def _in_generate(self) -> Request | None:
        gen = self.gen
        if gen.generate_depth and gen.generate_thread == threading.get_ident():
            return gen.current
        return None

    # -- the hooks' side -------------------------------------------------------------------
    def _generation_pre(self, module: Any, args: tuple[Any, ...]) -> bool:
        """At a top-level call: True when it is a forward of a request (then no step
        may end at its end)."""
        if "generation" in self._disabled:
            return False
        try:
            request = self._in_generate()
            if request is not None:
                model = request.model() if request.model is not None else None
                if module is model:
                    request.forward_started(request.prompt_len + len(request.forwards))
                    request.grad = request.grad or self._torch.is_grad_enabled()
                else:
                    request.calls += 1
                return True
            if self.gen.generate_depth:
                return False  # another thread's call while generate() runs
            return self._loop_pre(module, args)
        except StepLimitReached:
            raise
        except Exception as exc:
            self._disable("generation", exc)
            return False

    def _generation_post(self, module: Any) -> bool:
        """At the end of a top-level call: True when it was a request's forward."""
        if "generation" in self._disabled:
            return False
        try:
            request = self._in_generate()
            if request is not None:
                model = request.model() if request.model is not None else None
                if module is model:
                    request.forward_ended()
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
            if loop is gen.tentative:
                # held back until the next call tells what it was
                self._gen_held = self._take_row("forward", time.time())
                self._gen_held["_grad"] = False
                self.start_s = self._gen_held["end_s"]
            return True
        except Exception as exc:
            self._disable("generation", exc)
            return False

    # -- hand-written loops -----------------------------------------------------------------
    def _loop_pre(self, module: Any, args: tuple[Any, ...]) -> bool:
        gen = self.gen
        torch = self._torch
        if (
            self.mode != "auto"
            or self.backward_seen
            or self._optimizers_made
            or torch.is_grad_enabled()
        ):
            self._end_loop_request(at_last_forward=False)
            return False
        anchor = self._fwd_anchor() if self._fwd_anchor is not None else None
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
                self._gen_ids = ids
                if gen.record > len(gen.kept):
                    loop.seen.append(ids[:, -1:].detach())
                return True
            self._end_loop_request(at_last_forward=False)
        site = f"{frame.f_code.co_name} ({frame.f_code.co_filename}:{frame.f_lineno})"
        request = gen.new_request("loop", rows, length, rows * length, site=site)
        request.frame = frame
        request.seq_len = length
        request.model = weakref.ref(module)
        request.profiled = bool(self.profiled)
        if gen.loops_seen:
            self._start_loop_request(request)  # its row first: not inside its prefill's time
        else:
            gen.tentative = request
        request.forward_started(length)
        self._gen_ids = ids
        return True

    def _prefix_matches(self, ids: Any) -> bool | None:
        """Does the new sequence start with the last one (crops: shifted by one)? Only
        where both are on the CPU: on a GPU the comparison would sync the device."""
        last = self._gen_ids
        if last is None or not (ids.is_cpu and last.is_cpu) or ids.shape[0] != last.shape[0]:
            return None
        n, m = int(ids.shape[1]), int(last.shape[1])
        with contextlib.suppress(Exception):
            if n == m + 1:
                return bool(self._torch.equal(ids[:, :m], last))
            if n == m and n > 1:
                return bool(self._torch.equal(ids[:, :-1], last[:, 1:]))
            if n == 1:
                return None  # a cached step: only its new token is given
        return False

    def _confirm_loop(self, request: Request) -> None:
        """The second call continued the first: a decode loop, and the first call (held
        back as a forward step) is the request's prefill."""
        gen = self.gen
        gen.tentative = None
        gen.loops_seen = True
        held, self._gen_held = self._gen_held, None
        if held is not None:
            self.start_s = held["start_s"]
            self.data_wait += held["data_wait_s"]
            self.phase_s = add_phases(self.phase_s, held)
            self.batch += held["batch_size"] or 0
            self.batches += held["_batches"]
            self.profiled = self.profiled or held["profiled"]
        self._start_loop_request(request)

    def _start_loop_request(self, request: Request) -> None:
        self.gen.current = request
        self._reset_cuda_peak()
        self._writer().add_request(request.row())

    def _end_loop_request(self, at_last_forward: bool) -> None:
        """The loop's request (or its tentative first call) ends before the call under way
        (or at the job's end: ``at_last_forward``, where the step ends with its last
        forward, not with whatever the script did after)."""
        gen = self.gen
        if gen.tentative is not None:
            tentative, gen.tentative = gen.tentative, None
            held, self._gen_held = self._gen_held, None
            if held is not None:
                # the ordinary forward step it was: counted as one (no grad: see _loop_pre)
                module = tentative.model() if tentative.model is not None else None
                self.facts.on_forward_step(module, False, self.backward_seen)
                if at_last_forward:
                    self._emit(held)
                else:
                    self._release([held])
        request = gen.current
        if request is None or request.source != "loop":
            return
        gen.current = None
        self._gen_ids = None
        if request.forwards:
            position, start, seconds = request.forwards[-1]
            request.end_perf = start + seconds
        request.finish("done", len(request.forwards) * request.rows, len(request.forwards))
        request.meta["kv_cache"] = request.mode == "cache"
        if request.seen:
            # the tokens its calls were fed after the prefill: all it generated but the last
            request.generated = self._torch.cat(request.seen, dim=1).cpu().tolist()
            request.seen = []
        end = request.start_unix + (request.end_perf - request.start_perf)
        self._close_request(request, end if at_last_forward else time.time(), stop=True,
                            final=at_last_forward)  # fmt: skip

    def _close_request(self, request: Request, end: float, stop: bool, final: bool = False) -> None:
        """Write the request's row and, in a job read as forward steps, its step."""
        self._read_cuda_peak(request)
        self.gen.keep_tokens(request)
        self.facts.on_forward_step(
            request.model() if request.model is not None else None,
            request.grad,
            self.backward_seen,
        )
        writer = self._writer()
        if self.mode != "auto" or self._optimizers_made or self.backward_seen:
            writer.add_request(request.row())  # a training job's generation: no step
            return
        if self._pending_fwd:
            self._confirm_forward_steps()
        row = self._take_row("generate", end)
        row["batch_size"] = request.rows
        step = self.step
        self._emit(row)
        writer.add_request(request.row(step))
        if final:
            return
        if stop:
            self._after_emit(end)
        else:
            self.start_s = time.time()

    def _finalize_generation(self) -> None:
        """At the job's end: the loop request under way ends with its last forward; a
        generate() call under way (the job is dying inside it) stays 'running'."""
        with contextlib.suppress(Exception):
            self._end_loop_request(at_last_forward=True)
        try:
            self.gen.save_tokens(self._writer())
            if self.gen.prompts and self.gen.run_dir:
                save_prompts(self.gen.prompts, self.gen.run_dir, self._writer())
                self.gen.prompts = []
        except Exception as exc:
            self._disable("generated tokens", exc)

    def run_generation_sweep(self, original: Any, model: Any) -> None:
        """A sweep trial's first generate() call: the recorded prompts, batched, then the
        job stops (``generation_sweep.py``)."""
        gen = self.gen
        gen.sweep_done = True
        run_batches(self, original, model, gen.sweep or {}, gen.run_dir or ".")
        writer = self._writer()
        self.finalize()
        writer.update_run(stop_reason="sweep")
        writer.log("info", "generation", f"batch sweep done: {gen.count} requests")
        writer.flush()
        raise StepLimitReached(self.step)

    # -- memory -------------------------------------------------------------------------------
    def _reset_cuda_peak(self) -> None:
        torch = self._torch
        with contextlib.suppress(Exception):
            if torch.cuda.is_initialized():
                torch.cuda.reset_peak_memory_stats()

    def _read_cuda_peak(self, request: Request) -> None:
        torch = self._torch
        with contextlib.suppress(Exception):
            if torch.cuda.is_initialized():
                request.peak_cuda = float(torch.cuda.max_memory_allocated())
