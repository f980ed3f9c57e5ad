"""Batch-size sweeps: an inference job's DataLoader batch (``sweep``) or a generation
job's own requests batched (``generation_sweep``), run as an experiment's arms, and the
figures per batch size with the knee (``sweep_figures``).
"""
