"""A job that only records steps, through the BufferedWriter as a real job's collectors do.

Usage: record_steps.py HOME RUN_ID RANK STEPS [STEP_SECONDS]. It writes STEPS steps of
rank RANK (end_s is the wall clock when the step ended), closes the writer (the final
commit, as at a job's exit) and prints ``done``. The store is $STEPSCOPE_STORE or HOME's.
"""

from __future__ import annotations

import sys
import time

from stepscope.store import BufferedWriter

home, run_id, rank, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
step_s = float(sys.argv[5]) if len(sys.argv) > 5 else 0.01
writer = BufferedWriter(home, run_id, rank=rank)
print("started", flush=True)
for step in range(steps):
    start = time.time()
    time.sleep(step_s)
    writer.add_step(
        {"step": step, "start_s": start, "end_s": time.time(), "loss": 1.0 / (1 + step)}
    )
writer.close()
print("done", flush=True)
