"""A tiny training job that says what it recorded: the writer's load test reads it.

Usage: count_steps.py OUT_DIR NAME [STEP_MS]. Run under ``stepscope run``: it writes its
pid to OUT_DIR/NAME.pid, then trains a small model one step every STEP_MS (100) until
OUT_DIR/stop exists. Each step adds, through the process's own BufferedWriter (the one
the bootstrap made for the step timer), one sample (scope ``job``, metric ``step``, the
step's index as value) and every tenth step an artifact row. At the end it writes its
own counts to OUT_DIR/NAME.json, for the test to compare with what the store holds.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

from stepscope.collectors.injob import bootstrap

out, name = Path(sys.argv[1]), sys.argv[2]
step_s = float(sys.argv[3]) / 1000 if len(sys.argv) > 3 else 0.1
(out / f"{name}.pid").write_text(str(os.getpid()))
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(16, 8)
writer = bootstrap.writer()
steps = artifacts = 0
while not (out / "stop").exists():
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    writer.add_sample(time.time(), "job", "step", float(steps))
    if steps % 10 == 0:
        writer.add_artifact("job_note", str(out / f"{name}-{steps}.txt"), {"step": steps})
        artifacts += 1
    steps += 1
    time.sleep(step_s)
counts = {"steps": steps, "samples": steps, "artifacts": artifacts}
(out / f"{name}.json").write_text(json.dumps(counts))
