"""A fix's snippet with the values its experiment would use.

The Run page shows a snippet and the Optimize page tries a parameter; they must say the
same number (issue 39: the page said ``num_workers=4`` where the experiment used 2 on a
2-core host). The plan's ``choose_params`` decides the value; this writes it into the
snippet's ``name=value`` so the snippet never carries a number of its own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any


def _literal(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


def with_params(snippet: str, params: Mapping[str, Any]) -> str:
    """``snippet`` with each ``key=...`` of ``params`` set to its value (a keyword the
    snippet does not show is left out: it is the plan's detail, not the advice's)."""
    for key, value in params.items():
        pattern = re.compile(rf"\b{re.escape(str(key))}=[^,\n)]+")
        snippet = pattern.sub(lambda _m, k=key, v=value: f"{k}={_literal(v)}", snippet)
    return snippet
