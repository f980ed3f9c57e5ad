"""``stepscope check``: is a run measurably slower than its baseline? No experiment is
run: the figures (``perf_check``, ``check_result``) get intervals over several runs
(``over_runs``) or one run's widened by the host's run-to-run spread (``check_intervals``,
``host_spread``, measured by ``run_noise`` over ``noise_job``), and more work per step is
judged apart (``added_work``).
"""
