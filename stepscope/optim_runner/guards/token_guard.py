"""Token guard: does a generation job still say the same with a fix applied?

A generation job's answer is its tokens, not the logits of its first forwards. Each trial
of a generation job keeps the tokens its first requests generated
(``collectors/steps/generation.py``, ``tokens.json``; every arm runs with the same seed on the
same prompts), and a candidate's tokens are compared with the baseline's, request by
request and row by row. Decisions, and why:

* **The figures**: the share of identical tokens (position by position; a row that
  stopped earlier or later counts its extra tokens as different) and, per request, the
  position of the first divergence: greedy decoding that flips one near-tie token goes
  its own way from there, so where it diverged says more than how much.
* **Lossless fixes must keep every token.** A static cache, prompt lookup, SDPA attention,
  speculative decoding with a greedy verifier and batching compute the same greedy
  tokens: anything less than 100 % (beyond the baseline's own noise) means the fix
  changed the answers, and the experiment says so. Fixes that change numerics (bf16,
  int8) are held to ``min_agreement`` (``--min-agreement``).
* **Not comparable is not a failure.** When the baseline's own trials disagree with each
  other (sampling without a seed the plan could fix, a non-deterministic kernel), tokens
  cannot be compared one by one: the guard says so and checks nothing (``ok`` None).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from stepscope.optim_runner.guards.output_guard import OutputCheck
from stepscope.store import bounded_read
from stepscope.store.artifacts import kind_files

TOKENS_KIND = "generated_tokens"  # collectors/steps/generation.TOKENS_KIND


@dataclass(frozen=True)
class TokenDiff:
    """One trial's tokens against another's."""

    compared: int  # token positions compared (over both, rows and requests)
    identical: int
    first_divergence: list[int | None]  # per request compared: the first differing position
    requests: int

    @property
    def agreement(self) -> float:
        return self.identical / self.compared if self.compared else 1.0

    @property
    def diverged(self) -> int:
        return sum(p is not None for p in self.first_divergence)


def load_tokens(store: Any, run_id: int) -> list[dict[str, Any]] | None:
    """The requests' tokens a trial kept (None: it kept none)."""
    files = kind_files(store.artifacts(run_id), store.home, TOKENS_KIND)
    if not files:
        return None
    # capped: the row names the file (a ReadError, a ValueError, says why in one line)
    return list(json.loads(bounded_read.read_capped(files[-1])).get("requests") or [])


def compare_tokens(base: list[dict[str, Any]], cand: list[dict[str, Any]]) -> TokenDiff:
    """Request by request (in order), row by row, position by position."""
    compared = identical = 0
    firsts: list[int | None] = []
    for b, c in zip(base, cand, strict=False):
        first: int | None = None
        for row_b, row_c in zip(b["rows"], c["rows"], strict=False):
            same = sum(x == y for x, y in zip(row_b, row_c, strict=False))
            compared += max(len(row_b), len(row_c))
            identical += same
            diverge = next(
                (i for i, (x, y) in enumerate(zip(row_b, row_c, strict=False)) if x != y),
                None if len(row_b) == len(row_c) else min(len(row_b), len(row_c)),
            )
            if diverge is not None and (first is None or diverge < first):
                first = diverge
        if len(b["rows"]) != len(c["rows"]):
            first = 0 if first is None else first
        firsts.append(first)
    return TokenDiff(compared, identical, firsts, min(len(base), len(cand)))


def check_tokens(
    baseline: list[list[dict[str, Any]]],
    candidate: list[list[dict[str, Any]]],
    min_agreement: float,
    lossless: bool,
) -> OutputCheck:
    """Each candidate trial's tokens against the first baseline trial's; the worst decides.

    ``lossless``: every fix of the candidate keeps numerics, so every token must stay.
    """
    base = [b for b in baseline if b]
    cand = [c for c in candidate if c]
    if not base:
        return OutputCheck(
            None, "the baseline kept no generated tokens: not checked", kind="tokens"
        )
    if not cand:
        return OutputCheck(
            False, "the candidate kept no generated tokens while the baseline did", kind="tokens"
        )
    noise = [compare_tokens(a, b) for a, b in combinations(base, 2)]
    noise_gap = max((1.0 - d.agreement for d in noise), default=0.0)
    if noise_gap > 0:
        return OutputCheck(
            None,
            f"not comparable token by token: the baseline's own trials generated "
            f"{100 * (1 - noise_gap):.3g} % identical tokens (sampling without a fixed seed, "
            "or a non-deterministic model); not checked",
            None,
            None,
            noise_gap,
            kind="tokens",
            measure="token_agreement",
        )
    diffs = [compare_tokens(base[0], c) for c in cand]
    worst = min(diffs, key=lambda d: d.agreement)
    needed = 1.0 if lossless else min_agreement
    ok = worst.agreement >= needed
    firsts = [p for p in worst.first_divergence if p is not None]
    where = (
        f"; {worst.diverged} of {worst.requests} requests diverge, first at token {min(firsts)}"
        if firsts
        else f"; all {worst.requests} requests identical"
    )
    rule = "a lossless fix must keep every token" if lossless else f"at least {100 * needed:.3g} %"
    what = f"{100 * worst.agreement:.4g} % of {worst.compared} generated tokens identical ({rule}){where}"
    return OutputCheck(
        ok,
        ("tokens kept: " if ok else "the fix changed the answers: ") + what,
        1.0 - worst.agreement,
        1.0 - needed,
        noise_gap,
        kind="tokens",
        measure="token_agreement",
        agreement=worst.agreement,
        rows=worst.compared,
    )


__all__ = ["TOKENS_KIND", "TokenDiff", "check_tokens", "compare_tokens", "load_tokens"]
