"""Experiments: re-run a recorded job with fixes applied, and judge the gain.

``plan`` chooses the fixes and their parameters; ``experiment`` runs the trials
(``trials``), tells failed ones apart (``failures``), runs busy ones again
(``repeats``), stops arms and ends early when it knows (``adaptive``, ``design``) and
judges the rest (``verdict``, with ``stats``, ``quality``, ``bound_check`` and
``contention``); ``background`` runs an experiment in its own process for the dashboard.
The fixes themselves are applied inside the job by ``stepscope.fixes``.
"""
