"""The Optimize form's widgets for the experiment's options, built from their
declaration (``ExperimentOptions``' ``FormInput``: label, help, default, bounds), so
that the form, ``stepscope optimize`` and the background process cannot disagree on
an option's default or meaning."""

from __future__ import annotations

import dataclasses
from typing import Any

import streamlit as st

from stepscope.optim_runner.experiment.options import ExperimentOptions, form_input

_TYPES = {f.name: f.type for f in dataclasses.fields(ExperimentOptions)}


def option_input(name: str, key: str, where: Any = None) -> Any:
    """The widget of option ``name`` in ``where`` (a column; None: the page), its
    value typed as the option is: a toggle for a bool option, a number input
    otherwise."""
    shown = form_input(name)
    where = st if where is None else where
    kind = str(_TYPES[name])
    if kind in ("bool", str(bool)):
        return bool(where.toggle(shown.label, value=bool(shown.default), key=key, help=shown.help))
    whole = kind.startswith("int")
    cast = int if whole else float
    bounds = {
        k: cast(v)
        for k, v in (("min_value", shown.min_value), ("max_value", shown.max_value))
        if v is not None
    }
    extra = {k: v for k, v in (("step", shown.step), ("format", shown.format)) if v is not None}
    value = where.number_input(
        shown.label, value=cast(shown.default), key=key, help=shown.help, **bounds, **extra
    )
    return cast(value)


__all__ = ["option_input"]
