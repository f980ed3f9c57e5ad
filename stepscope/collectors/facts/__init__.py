"""What is known about the host and the job beside its steps: the host's calibrated peaks,
the environment recorded with each run, what the job switched on, and which training
worker a process is.
"""
