"""Collectors: the bootstrap and timers that run inside the job, and the samplers beside it.

By story: ``launch/`` (``stepscope run``), ``injob/`` (the bootstrap), ``steps/``,
``capture/``, ``trials/``, ``samplers/``, ``attach/`` and ``facts/``.
"""
