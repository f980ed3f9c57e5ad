"""A job that reports, from inside, the settings its own objects ended up with.

It builds a DataLoader, an optimizer and a small conv net the way a user script would
(no stepscope import) and prints one line ``PROBE {json}`` at the end: what the plan's
patches changed is visible here, in the job's own objects. Options: --steps N,
--explicit-workers W (pass num_workers explicitly), --ddp (wrap in a 1-process gloo DDP),
--helper (at the end, a fresh Python that imports torch, as inductor's compile workers do).
"""

import argparse
import json
import os
import subprocess
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Data(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)  # per-index: same data whatever the workers
        return torch.randn(3, 8, 8, generator=g), torch.randint(0, 4, (), generator=g)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--explicit-workers", type=int, default=None)
    p.add_argument("--ddp", action="store_true")
    p.add_argument("--helper", action="store_true")
    a = p.parse_args()
    torch.manual_seed(0)
    kwargs = {} if a.explicit_workers is None else {"num_workers": a.explicit_workers}
    loader = DataLoader(Data(), batch_size=16, shuffle=False, **kwargs)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 8 * 8, 4)
    )
    seen = {}

    def probe(module, args, output):
        seen["autocast_cpu"] = torch.is_autocast_enabled("cpu")
        seen["out_dtype"] = str(output.dtype)
        seen["input_channels_last"] = args[0].is_contiguous(memory_format=torch.channels_last)

    model[0].register_forward_hook(probe)
    if a.ddp:
        import torch.distributed as dist

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        dist.init_process_group("gloo", rank=0, world_size=1)
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    it = iter(loader)
    for _ in range(a.steps):
        x, y = next(it)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    if a.helper:  # it inherits the job's environment, the plan included
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
    inner = model.module if a.ddp else model
    out = {
        "num_workers": loader.num_workers,
        "persistent_workers": loader.persistent_workers,
        "prefetch_factor": loader.prefetch_factor,
        "batch_size": loader.batch_size,
        "foreach": opt.defaults.get("foreach"),
        "fused": opt.defaults.get("fused"),
        "threads": torch.get_num_threads(),
        "weight_channels_last": inner[0].weight.is_contiguous(memory_format=torch.channels_last),
        "losses": losses,
        **seen,
    }
    if a.ddp:
        out["ddp"] = {
            "bucket_cap_mb": model.bucket_bytes_cap / 2**20,
            "gradient_as_bucket_view": model.gradient_as_bucket_view,
            "static_graph": model.static_graph,
        }
        torch.distributed.destroy_process_group()
    print("PROBE " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
