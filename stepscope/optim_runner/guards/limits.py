"""The output guard's default limits, as plain numbers.

Apart from ``output_guard.py`` (which reads outputs, with numpy) so that the
experiment's options (``experiment/options.py``: ``stepscope --help`` and the
dashboard's form) can show them without importing the guard.
"""

from __future__ import annotations

DEFAULT_OUTPUT_TOLERANCE = 1e-2  # largest relative difference of regression outputs
DEFAULT_MIN_AGREEMENT = 0.99  # top-1 agreement of classifier outputs

__all__ = ["DEFAULT_MIN_AGREEMENT", "DEFAULT_OUTPUT_TOLERANCE"]
