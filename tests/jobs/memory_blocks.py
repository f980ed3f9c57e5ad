"""A small transformer-style trainer: a ModuleList of blocks, AdamW, a few steps.

Its peak holds every kind of memory torch's timeline tells apart (parameters, gradients,
AdamW's two moments, the blocks' activations), so the memory breakdown has something
to split. Options: --steps N, --batch B, --seq T, --width D, --blocks L;
--no-timeline-export: run as under a torch without ``profile.export_memory_timeline``
(deprecated in torch 2.x): the capture must keep its trace and say why in one line.
"""

import argparse

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.attn = nn.Linear(width, 3 * width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x):
        q, k, v = self.attn(self.norm(x)).chunk(3, dim=-1)
        att = torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1)
        x = x + att @ v
        return x + self.mlp(x)


class Model(nn.Module):
    def __init__(self, width: int, blocks: int):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(blocks))
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x).mean()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--no-timeline-export", action="store_true")
    p.add_argument("--device", default="cpu", help="cpu, or cuda for tests/gpu/")
    a = p.parse_args()
    if a.no_timeline_export:
        for cls in torch.profiler.profile.__mro__:  # defined on a base class
            if "export_memory_timeline" in vars(cls):
                delattr(cls, "export_memory_timeline")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Model(a.width, a.blocks).to(a.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(a.steps):
        x = torch.randn(a.batch, a.seq, a.width, device=a.device)
        loss = model(x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    print("params", sum(t.numel() * t.element_size() for t in model.parameters()))


if __name__ == "__main__":
    main()
