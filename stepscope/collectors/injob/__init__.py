"""The in-job bootstrap: ``boot/sitecustomize.py`` (first on the job's PYTHONPATH) calls
``bootstrap.install()`` in every Python process of the job, which installs the step timer,
the capture, the plan's fixes and the ``generate()`` patch.
"""
