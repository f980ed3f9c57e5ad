"""Exit codes every command shares, so a script reads them the same whatever it ran.

An unknown run (a mistyped id, name or tag: ``RunNotFound``) exits 1 from every command
that takes a run, with one line on stderr naming what was not found. A refused action
(another user's run, an unsigned command: ``app.ownership``) exits 2, with one line
naming the run, the field and the reason.
"""

from __future__ import annotations

EXIT_UNKNOWN_RUN = 1
EXIT_REFUSED = 2
