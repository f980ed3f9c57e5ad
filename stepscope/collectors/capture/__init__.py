"""Profiler captures inside the job: when a window of torch.profiler steps opens (the
default once step times settle, or on request through a file in the run folder), and
the trace and memory snapshot it writes.
"""
