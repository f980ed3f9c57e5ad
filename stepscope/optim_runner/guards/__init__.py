"""Does the job still answer the same with a fix applied? The guards a candidate's trials
pass against the baseline's: losses (``quality``), an inference job's outputs
(``output_guard``), a generation job's tokens (``token_guard``), and which one judges
(``guard``).
"""
