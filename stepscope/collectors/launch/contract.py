"""What the launcher (`stepscope run`) tells the bootstrap inside the job.

Everything crosses the process boundary as environment variables, because the
environment is what `torchrun`, DataLoader workers and `subprocess` children inherit
without any cooperation from the user's code.
"""

from __future__ import annotations

ENV_RUN_ID = "STEPSCOPE_RUN_ID"  # int; the bootstrap stays inert without it
ENV_HOME = "STEPSCOPE_HOME"  # store directory
ENV_STORE = "STEPSCOPE_STORE"  # the store's URL when it is not the home's file (store/url.py)
ENV_RUN_DIR = "STEPSCOPE_RUN_DIR"  # the run's artifact folder (traces, control/)
ENV_MAX_STEPS = "STEPSCOPE_MAX_STEPS"  # int; stop the job cleanly after N steps
ENV_PROFILE_AT = "STEPSCOPE_PROFILE_AT"  # int; first step of a capture window, or:
PROFILE_AUTO = "auto"  # the default capture of `stepscope run`: once step times settle
ENV_PROFILE_STEPS = "STEPSCOPE_PROFILE_STEPS"  # int; steps in that window
ENV_FLUSH_S = "STEPSCOPE_FLUSH_S"  # float; writer flush interval (default 1.0)
ENV_PACKAGE_PATH = "STEPSCOPE_PACKAGE_PATH"  # dir holding the stepscope package
ENV_PREV_PYTHONPATH = "STEPSCOPE_PREV_PYTHONPATH"  # the user's PYTHONPATH, to chain to
ENV_DISABLE = "STEPSCOPE_DISABLE"  # "1": bootstrap does nothing (escape hatch)
ENV_PLAN = "STEPSCOPE_PLAN"  # path of a plan JSON: fixes to apply inside the job (below)

# The plan file (written by the experiment runner, read by optim_runner/apply.py):
#   {"fixes": {"<fix id>": {<parameters>}, ...},   # e.g. {"dataloader_workers": {"num_workers": 4}}
#    "override_explicit": true,                    # replace values the user's code set (default)
#    "seed": 0 | null,                             # seed the RNGs before the script runs
#    "record_outputs": N}                          # optional: keep the model's first N outputs
#                                                  # (inference trials; trials/output_record.py)
# Every change applied is logged to the run's events (source 'apply') and listed in
# the run's config under "applied".

CONTROL_DIRNAME = "control"  # <run_dir>/control/capture.json requests a capture
CAPTURE_REQUEST_FILE = "capture.json"  # {"id": str, "steps": int}
