"""Plotly figures for the dashboard: plain functions from DataFrames to figures.

No Streamlit in here, so each chart can be built (and checked) outside a page. Times
on screen are milliseconds for steps and seconds since the run's start for
timelines: the units people read off a profiler. One module per what is drawn:
``steps`` (one run's steps), ``system`` (its samples over time), ``trace`` (a
profiler capture), ``stacks`` (an attached job's stack samples), ``latency`` (an inference run's
requests), ``compare`` (two runs, or an experiment's arms); ``style`` is what they share.
"""
