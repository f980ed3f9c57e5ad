"""Probe what the GPU machine offers before relying on it: CUPTI tracing, memory history, NVML."""

import gzip
import json
import os
import pickle
import sys
import tempfile
import time

import torch

print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)
print("device", torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))
x = torch.randn(4096, 4096, device="cuda")
out = tempfile.mkdtemp()
torch.cuda.memory._record_memory_history(max_entries=10000)
with torch.profiler.profile(
    activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
    record_shapes=True, profile_memory=True, with_stack=True,
) as prof:
    for _ in range(3):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = x @ x
        y.float().sum().item()
        prof.step()
path = os.path.join(out, "t.pt.trace.json.gz")
prof.export_chrome_trace(path)
torch.cuda.memory._dump_snapshot(os.path.join(out, "snap.pickle"))
torch.cuda.memory._record_memory_history(enabled=None)
d = json.load(gzip.open(path))
cats = {}
for e in d["traceEvents"]:
    cats[e.get("cat")] = cats.get(e.get("cat"), 0) + 1
print("trace cats", cats)
print("kernels", sorted({e["name"][:60] for e in d["traceEvents"] if e.get("cat") == "kernel"})[:8])
snap = pickle.load(open(os.path.join(out, "snap.pickle"), "rb"))
print("snapshot keys", list(snap.keys()), "segments", len(snap["segments"]))
import pynvml

pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
print("nvml util", pynvml.nvmlDeviceGetUtilizationRates(h).gpu, "mem", pynvml.nvmlDeviceGetMemoryInfo(h).used)
print("nvml procs", [(p.pid, p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)], "me", os.getpid())
for f in ("nvmlDeviceGetPowerUsage", "nvmlDeviceGetClockInfo", "nvmlDeviceGetPcieThroughput"):
    try:
        fn = getattr(pynvml, f)
        v = fn(h) if f == "nvmlDeviceGetPowerUsage" else fn(h, 1 if f == "nvmlDeviceGetClockInfo" else pynvml.NVML_PCIE_UTIL_TX_BYTES)
        print(f, v)
    except Exception as exc:
        print(f, "FAILED", exc)
ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
ev0.record(); y = x @ x; ev1.record(); time.sleep(0.1)
print("event query", ev1.query(), "elapsed ms", ev0.elapsed_time(ev1))
print("torch.compile", torch.compile(lambda a: (a.sin() + 1).sum())(x).item() is not None)
