"""Command lines with what looks like a secret masked, for lists other people may read.

The Attach page and ``stepscope attach --list`` show every Python process of the host with
its command line, and people pass tokens there: ``--hf-token hf_...``, ``--password=...``,
``WANDB_API_KEY=...`` through ``env``, a database URL with its password. What looks like
one is replaced by ``***``; the rest stays readable, since the list is how a user finds
their job. A false positive costs a masked argument, a miss a leaked secret: the names
are matched broadly.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

MASK = "***"
# "token" but not a count of tokens (--max-new-tokens) nor a tokenizer
_SECRET_WORD = r"(?:token(?!s|iz)|passw(?:or)?d|pwd|secret|api[-_]?key|access[-_]?key|private[-_]?key|credential|auth)"
# --token X, --api-key=X, -password X
_OPTION = re.compile(rf"^(-{{1,2}}[\w.-]*{_SECRET_WORD}[\w.-]*)(=.*)?$", re.IGNORECASE)
# HF_TOKEN=X, aws_secret_access_key=X (an env assignment, or a key=value argument)
_ASSIGNMENT = re.compile(rf"^([A-Za-z_][\w.-]*{_SECRET_WORD}[\w.-]*)=(.+)$", re.IGNORECASE)
# scheme://user:password@host
_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/@\s]*:)[^@\s]+@", re.IGNORECASE)


def masked(argv: Sequence[str]) -> list[str]:
    """``argv`` with the values of secret-looking options and assignments, and the
    passwords of URLs, replaced by ``***``."""
    out: list[str] = []
    mask_next = False
    for arg in argv:
        arg = str(arg)
        if mask_next and not arg.startswith("-"):
            out.append(MASK)
            mask_next = False
            continue
        mask_next = False
        option = _OPTION.match(arg)
        if option:
            if option.group(2) is None:
                mask_next = True  # its value is the next argument
                out.append(arg)
            else:
                out.append(f"{option.group(1)}={MASK}")
            continue
        assignment = _ASSIGNMENT.match(arg)
        if assignment:
            out.append(f"{assignment.group(1)}={MASK}")
            continue
        out.append(_URL_PASSWORD.sub(rf"\1{MASK}@", arg))
    return out


__all__ = ["MASK", "masked"]
