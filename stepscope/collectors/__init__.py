"""Collectors: the bootstrap and timers that run inside the job, and the samplers beside it."""
