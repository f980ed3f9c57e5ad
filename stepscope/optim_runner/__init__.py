"""Experiments: re-run a recorded job with fixes applied, and judge the gain.

By story, lowest first (a folder imports only those before it): ``speedup/`` (is B
faster than A, with an interval), ``guards/`` (does the job still answer the same),
``trials/`` (the plan, the arms and their interleaved trials, failed and busy ones),
``verdict/`` (judging an experiment's trials), ``experiment/`` (one experiment and its
adaptive design), ``sweeps/`` (batch-size sweeps), ``check/`` (``stepscope check``: a run
against its baseline, no experiment run). ``background`` runs an experiment or a sweep
in its own process for the dashboard. The fixes themselves are applied inside the job by
``stepscope.fixes``.
"""
