"""The model's state when a job runs out (``collectors/injob/model_state.py``) and the
lines that say what held the memory and what each remedy would free
(``analyzers/rules/memory_state.py``): real modules and optimizers, counted against the
bytes their tensors hold; records as a shared store may hold them."""

from __future__ import annotations

import pytest
import torch

from stepscope.analyzers.rules.memory_state import model_state_evidence, peak_remedies
from stepscope.collectors.injob.model_state import model_state_bytes

CPU = torch.device("cpu")


class Tied(torch.nn.Module):
    """An embedding and a head that share their weight, a norm, a frozen layer (a
    fine-tune's base: no optimizer holds it) and a mask buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(100, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.head = torch.nn.Linear(16, 100, bias=False)
        self.head.weight = self.emb.weight  # tied: one storage
        self.frozen = torch.nn.Linear(16, 16).requires_grad_(False)
        self.register_buffer("mask", torch.ones(8, 8))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.emb(idx)))


def test_parameters_gradients_and_adams_moments_each_storage_once() -> None:
    model = Tied()
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(trained, lr=1e-3)
    before = model_state_bytes([opt], model, torch, CPU)
    weights = 100 * 16 * 4 + 2 * 16 * 4 + (16 * 16 + 16) * 4  # tied once, norm, frozen
    assert before == {
        "parameters": weights, "gradients": 0, "optimizer_state": 0, "buffers": 64 * 4,
        "optimizers": 1,
    }  # fmt: skip
    model(torch.randint(0, 100, (2, 8))).sum().backward()
    opt.step()
    after = model_state_bytes([opt], model, torch, CPU)
    grads = (100 * 16 + 2 * 16) * 4  # the frozen layer has none
    assert after["gradients"] == grads
    # two moments per trained parameter, and Adam's step counters (a 4-byte tensor each)
    assert after["optimizer_state"] == 2 * grads + 3 * 4
    assert model_state_bytes([], None, torch, CPU) is None
    assert model_state_bytes([opt], model, torch, torch.device("meta"))["parameters"] == 0


def _record(**fields: object) -> dict:
    held = {"parameters": 2 * 2**30, "gradients": 2 * 2**30, "optimizer_state": 4 * 2**30}
    return {"model_state": {**held, "buffers": 0, "optimizers": 1}, **fields}


def test_what_held_it_and_what_would_free_it_on_cuda() -> None:
    held, frees = model_state_evidence(_record(cuda_allocated_bytes=20 * 2**30))
    assert held.text == (
        "held by the model's state: parameters 2.0 GiB, gradients 2.0 GiB, optimizer state "
        "4.0 GiB (8.0 GiB); the rest of what was in use, 12.0 GiB, the step's (activations "
        "and temporaries)"
    )
    assert frees.text == (
        "would free (advice): 8-bit optimizer state about 3.0 GiB; the optimizer state "
        "offloaded to the CPU 4.0 GiB; sharding over 2 ranks (FSDP) about 4.0 GiB per rank; "
        "half the micro-batch (2 accumulation steps) about 6.0 GiB"
    )


def test_on_the_cpu_the_rest_is_an_upper_bound_and_nothing_is_offloaded() -> None:
    held, frees = model_state_evidence(_record(rss_bytes=10 * 2**30))
    assert "the step's (activations, temporaries and the process's libraries)" in held.text
    assert "offloaded" not in frees.text and "micro-batch" not in frees.text


@pytest.mark.parametrize(
    "state",
    [None, "lots", {"parameters": "1e12"}, {"parameters": -5}, {"parameters": True}, {}],
)
def test_a_record_that_is_not_numbers_gives_no_line(state: object) -> None:
    assert model_state_evidence({"model_state": state, "rss_bytes": 2**30}) == []


def test_at_a_captures_peak_the_step_is_its_tensors() -> None:
    """From the timeline's categories the step's bytes are exact on the CPU too (tensors
    only): the micro-batch line is given; an inference peak (no gradient, no optimizer
    state) gets none."""
    mib = 2**20
    peak = [
        {"category": "PARAMETER", "bytes": 100 * mib},
        {"category": "GRADIENT", "bytes": 100 * mib},
        {"category": "OPTIMIZER_STATE", "bytes": 200 * mib},
        {"category": "ACTIVATION", "bytes": 500 * mib},
        {"category": "TEMPORARY", "bytes": 100 * mib},
        {"category": "UNKNOWN", "bytes": 999 * mib},  # neither the model's nor the step's
    ]
    assert peak_remedies(peak, "cpu") == [
        "8-bit optimizer state about 150.0 MiB",
        "sharding over 2 ranks (FSDP) about 200.0 MiB per rank",
        "half the micro-batch (2 accumulation steps) about 300.0 MiB",
    ]
    assert "the optimizer state offloaded to the CPU 200.0 MiB" in peak_remedies(peak, "cuda:0")
    assert peak_remedies(peak[:1] + peak[3:], "cpu") == []
    assert peak_remedies([{"category": "GRADIENT", "bytes": "x"}, None], "cpu") == []  # type: ignore[list-item]
