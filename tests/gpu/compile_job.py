"""torch.compile under the bootstrap: an inference loop (forward hooks active while
compiling) then nothing else. Prints the graph-break count dynamo saw."""

import sys

import torch
from torch import nn
from torch._dynamo.utils import counters

mode = sys.argv[1]
dev = torch.device("cuda")
model = nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 256), nn.LayerNorm(256)).to(
    dev
)
cmodel = torch.compile(model)
x = torch.randn(64, 256, device=dev)
if mode == "infer":
    with torch.no_grad():
        for _ in range(12):
            cmodel(x)
else:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(12):
        cmodel(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
torch.cuda.synchronize()
print("graph_breaks", sum(counters["graph_break"].values()), dict(counters["graph_break"]))
