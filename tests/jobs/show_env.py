"""Prints what the bootstrap did in this process; imports torch only with --torch."""

import os
import sys
import threading

print("user sitecustomize:", os.environ.get("USER_SITECUSTOMIZE_RAN", "no"))
print("torch imported:", "torch" in sys.modules)
print("stepscope imported:", "stepscope" in sys.modules)
if "--torch" in sys.argv:
    import torch  # noqa: F401

    from stepscope.collectors.steps import step_timer

    print("step timer installed:", step_timer.current() is not None)
    names = [t.name for t in threading.enumerate()]
    print("writer thread:", "stepscope-writer" in names)
