"""Batching a generation job's own requests, inside the job: the sweep's in-job side.

``stepscope optimize RUN --sweep batch`` on a generation run measures what batching the
job's requests would buy, with the job's own model and the job's own prompts, without a
code change (``optim_runner/sweeps/generation_sweep.py`` runs the trials):

1. a capture trial runs the job with ``"record_prompts": N`` in its plan: the first N
   requests' prompts (each row's token ids, padding left out) and the settings of their
   generate() calls go to ``prompts.json`` in the run folder (``record_prompt``);
2. each batch-size trial runs the job with ``"generation_sweep": {"batch_size": B,
   "prompts": PATH}``: at the job's first generate() call, once its model is built and
   on its device, the recorded prompts are generated B at a time (left-padded, with an
   attention mask, so that each row is computed as it would be alone), each batch one
   request of the run; then the job is stopped (``stop_reason`` 'sweep', exit code 0).

Each prompt row's new tokens go to ``tokens.json`` as one request each, in the prompts'
order, whatever the batch size: the token guard (``optim_runner/guards/token_guard.py``) then
compares batch B's answers with batch 1's position by position.
"""

from __future__ import annotations

import json
import os
from typing import Any

PROMPTS_FILE = "prompts.json"
PROMPTS_KIND = "prompts"
RECORD_KEY = "record_prompts"
SWEEP_KEY = "generation_sweep"
# generate() settings that travel with a prompt (plain values only: a streamer or a
# logits processor object cannot be replayed, and is left out)
REPLAYED = (
    "max_new_tokens",
    "min_new_tokens",
    "max_length",
    "do_sample",
    "num_beams",
    "temperature",
    "top_k",
    "top_p",
    "repetition_penalty",
    "no_repeat_ngram_size",
    "num_return_sequences",
    "use_cache",
    "eos_token_id",
    "pad_token_id",
)


def plan_settings(plan_path: str | None) -> tuple[int, dict[str, Any] | None]:
    """(prompts to record, the sweep's settings) from the plan file."""
    if not plan_path:
        return 0, None
    try:
        with open(plan_path, encoding="utf-8") as fh:
            plan = json.load(fh)
    except Exception:
        return 0, None  # the plan's own loader says what is wrong with the file
    if not isinstance(plan, dict):
        return 0, None
    sweep = plan.get(SWEEP_KEY)
    return max(0, int(plan.get(RECORD_KEY) or 0)), sweep if isinstance(sweep, dict) else None


def record_prompt(torch: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """One generate() call's prompt rows (token ids without padding) and settings."""
    ids = kwargs.get("input_ids")
    if ids is None:
        ids = kwargs.get("inputs", args[0] if args else None)
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        raise ValueError("a generate() call without 2-D token ids cannot be replayed")
    mask = kwargs.get("attention_mask")
    rows = []
    ids_cpu = ids.detach().cpu()
    mask_cpu = mask.detach().cpu().bool() if isinstance(mask, torch.Tensor) else None
    for i in range(ids_cpu.shape[0]):
        row = ids_cpu[i] if mask_cpu is None else ids_cpu[i][mask_cpu[i]]
        rows.append([int(t) for t in row])
    settings = {k: kwargs[k] for k in REPLAYED if isinstance(kwargs.get(k), (bool, int, float))}
    return {"rows": rows, "kwargs": settings}


def save_prompts(prompts: list[dict[str, Any]], run_dir: str, writer: Any) -> None:
    path = os.path.join(run_dir, PROMPTS_FILE)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({"prompts": prompts}, fh)
    writer.add_artifact(PROMPTS_KIND, path, {"prompts": len(prompts)})


def _warm_up(
    timer: Any, original: Any, model: Any, prompts: list[Any], pad: int, device: Any
) -> None:
    """Two tokens of the first prompt, unrecorded: the first generate() call's one-off
    set-up (lazy initialisation, caches) is not batch 1's to pay."""
    torch = timer._torch
    row = next((r for p in prompts for r in p["rows"]), None)
    if not row:
        return
    inert, timer.inert = timer.inert, True
    try:
        ids = torch.tensor([row], device=device)
        original(model, input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=2,
                 do_sample=False, pad_token_id=pad)  # fmt: skip
    finally:
        timer.inert = inert


def run_batches(
    timer: Any, original: Any, model: Any, spec: dict[str, Any], run_dir: str
) -> list[list[int]]:
    """Generate the recorded prompts ``spec["batch_size"]`` rows at a time; each batch is
    a request of the run. Returns each prompt row's new tokens, in the prompts' order."""
    # local: the bootstrap imports this module in every trial; only a sweep's reads
    from stepscope.store.bounded_read import read_capped

    torch = timer._torch
    prompts = json.loads(read_capped(spec["prompts"]))["prompts"]  # the plan names a row's file
    size = max(1, int(spec["batch_size"]))
    config = getattr(model, "generation_config", None)
    pad = getattr(config, "pad_token_id", None)
    if pad is None:
        eos = getattr(config, "eos_token_id", None)
        pad = (eos[0] if isinstance(eos, list) and eos else eos) if eos is not None else 0
    device = next(model.parameters()).device
    # rows of one batch share their settings: group the prompts' rows by them
    groups: dict[str, list[tuple[int, list[int]]]] = {}
    order = 0
    for prompt in prompts:
        key = json.dumps(prompt["kwargs"], sort_keys=True)
        for row in prompt["rows"]:
            groups.setdefault(key, []).append((order, row))
            order += 1
    answers: list[list[int]] = [[] for _ in range(order)]
    timer.max_steps = None  # every batch runs: the sweep ends the job itself
    _warm_up(timer, original, model, prompts, pad, device)
    for key, rows in groups.items():
        settings = json.loads(key)
        settings.pop("num_return_sequences", None)  # one answer per row: comparable
        for start in range(0, len(rows), size):
            batch = rows[start : start + size]
            width = max(len(r) for _, r in batch)
            ids = torch.tensor([[pad] * (width - len(r)) + r for _, r in batch], device=device)
            mask = torch.tensor(
                [[0] * (width - len(r)) + [1] * len(r) for _, r in batch], device=device
            )
            kwargs = {**settings, "input_ids": ids, "attention_mask": mask, "pad_token_id": pad}
            request = timer.begin_generate(model, (), kwargs)
            try:
                output = original(model, **kwargs)
            except BaseException as exc:
                timer.end_generate(request, None, exc)
                raise
            timer.end_generate(request, output, None)
            generated = request.generated if request is not None else None
            for (index, _), tokens in zip(batch, generated or [], strict=False):
                answers[index] = tokens
    with open(os.path.join(run_dir, "tokens.json"), "w", encoding="utf-8") as fh:
        json.dump({"requests": [{"request": i, "rows": [t]} for i, t in enumerate(answers)]}, fh)
    timer._writer().add_artifact("generated_tokens", os.path.join(run_dir, "tokens.json"), {})
    return answers


__all__ = [
    "PROMPTS_FILE",
    "PROMPTS_KIND",
    "RECORD_KEY",
    "SWEEP_KEY",
    "plan_settings",
    "record_prompt",
    "run_batches",
    "save_prompts",
]
