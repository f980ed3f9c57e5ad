"""Readings taken from outside the job: the system sampler's process (psutil, NVML's GPU
readings, per-process OS counters) and py-spy's Python stack samples.
"""
