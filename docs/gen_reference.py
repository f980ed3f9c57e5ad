"""MkDocs hook: the reference pages made from the code at build time, never committed.

A committed copy of the CLI's options or of the fix catalog would go stale the day a flag
or a fix changes. So ``mkdocs build`` (``hooks:`` in mkdocs.yml) imports the parser
(``stepscope.app.cli.main.build_parser``) and the fix catalog, and writes
``reference/cli.md`` and ``reference/fixes.md`` into the build only. The fix modules are
found through the catalog's registry, or by walking the ``stepscope.fixes`` package, never
by their file paths: modules move, their ``FIX`` objects stay.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import inspect
import pkgutil
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from mkdocs.structure.files import File, Files

CLI_PAGE = "reference/cli.md"
FIXES_PAGE = "reference/fixes.md"
USAGE_WIDTH = 88


def on_files(files: Files, config: Any) -> Files:
    """Add the generated pages to the build (mkdocs calls this before reading pages)."""
    for path, text in ((CLI_PAGE, cli_page()), (FIXES_PAGE, fixes_page())):
        old = files.get_file_from_path(path)
        if old is not None:
            files.remove(old)
        files.append(File.generated(config, path, content=text))
    return files


# -- the CLI ------------------------------------------------------------------------------


def cli_page() -> str:
    # local: the hook module is loaded by mkdocs before the build needs stepscope
    from stepscope.app.cli.main import build_parser

    parser = build_parser()
    out = [
        "# Command line",
        "",
        "Every `stepscope` command and option, generated from the CLI's own parser "
        "when this site is built (`stepscope VERB --help` prints the same).",
        "",
    ]
    out += _parser_section(parser, "stepscope", level=2)
    return "\n".join(out) + "\n"


def _parser_section(parser: argparse.ArgumentParser, name: str, level: int) -> list[str]:
    out = [f"{'#' * level} `{name}`", ""]
    if parser.description:
        out += [_text(parser.description), ""]
    # one width whatever the terminal that builds the site ($COLUMNS)
    parser.formatter_class = functools.partial(parser.formatter_class, width=USAGE_WIDTH)
    usage = parser.format_usage().strip().removeprefix("usage: ")
    out += ["```text", usage, "```", ""]
    rows = [_option_row(parser, action) for action in parser._actions if _shown(action)]
    if rows:
        out += ["| option | meaning |", "| --- | --- |", *rows, ""]
    for verb, sub in _subparsers(parser):
        out += _parser_section(sub, f"{name} {verb}", level=min(level + 1, 4))
    return out


def _shown(action: argparse.Action) -> bool:
    if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
        return False
    return action.help != argparse.SUPPRESS


def _option_row(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if action.option_strings:
        metavar = "" if action.nargs == 0 else f" {_metavar(action)}"
        flags = ", ".join(f"`{flag}{metavar}`" for flag in action.option_strings)
    else:
        flags = f"`{_metavar(action)}`"
    helptext = parser._get_formatter()._expand_help(action) if action.help else ""
    return f"| {flags} | {_cell(helptext)} |"


def _metavar(action: argparse.Action) -> str:
    if action.metavar is not None:
        return action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
    if action.choices is not None:
        return "{" + ",".join(str(c) for c in action.choices) + "}"
    return action.dest.upper() if action.option_strings else action.dest


def _subparsers(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for verb, sub in action.choices.items():
                if id(sub) not in seen:  # an alias maps to the same parser
                    seen.add(id(sub))
                    yield verb, sub


def _text(text: str) -> str:
    return " ".join(text.split())


def _cell(text: str) -> str:
    return _text(text).replace("|", "\\|")


# -- the fix catalog ----------------------------------------------------------------------


def fix_modules() -> list[tuple[ModuleType, Any]]:
    """Each catalog module with its ``FIX``, in the catalog's order (advice order)."""
    # local: imported at build time only
    import stepscope.fixes as fixes

    registry = getattr(fixes, "MODULES", None)
    if registry:
        return [(module, module.FIX) for module in registry]
    found = []
    for info in pkgutil.walk_packages(fixes.__path__, fixes.__name__ + "."):
        module = importlib.import_module(info.name)
        fix = getattr(module, "FIX", None)
        if isinstance(fix, fixes.Fix):
            found.append((module, fix))
    return found


WAYS_IN = {
    "set_global": "a global switch, set when torch is imported",
    "on_loader": "the DataLoader's constructor",
    "on_model": "the model's first top-level call",
    "ddp_kwargs": "DistributedDataParallel's constructor arguments",
    "after_ddp": "the DDP module once it is built",
    "on_generate": "the arguments of `generate()`",
    "patch": "a patch of torch installed in the job",
}


def fixes_page() -> str:
    entries = fix_modules()
    out = [
        "# Fix catalog",
        "",
        f"The {len(entries)} fixes stepscope recommends, in the order advice is given, "
        "generated from each fix's `FIX` declaration when this site is built. "
        "*Automatic* fixes are applied inside the job by `stepscope optimize` with no code "
        "change; the others are advice with a snippet. A fix that changes numerics runs "
        "only with `--allow-numerics`. How to add one: "
        "[Architecture, Fixes](../architecture.md#fixes).",
        "",
        "| fix | title | addresses | automatic | numerics |",
        "| --- | --- | --- | --- | --- |",
    ]
    for _, fix in entries:
        out.append(
            f"| [`{fix.id}`](#{fix.id}) | {_cell(fix.title)} | "
            f"{', '.join(f'`{a}`' for a in fix.addresses)} | {'yes' if fix.auto else 'no'} | "
            f"{'changes' if fix.changes_numerics else 'same'} |"
        )
    out.append("")
    for module, fix in entries:
        out += _fix_section(module, fix)
    return "\n".join(out) + "\n"


def _fix_section(module: ModuleType, fix: Any) -> list[str]:
    out = [f"## `{fix.id}` {{ #{fix.id} }}", "", f"**{_text(fix.title)}**", ""]
    if fix.why:
        out += [f"Why: {_text(fix.why)}", ""]
    facts = [
        ("addresses", ", ".join(f"`{a}`" for a in fix.addresses)),
        ("requires", ", ".join(f"`{r}`" for r in fix.requires) or "nothing"),
        ("applied", _way_in(fix)),
        ("numerics", "changes what the model computes" if fix.changes_numerics else "unchanged"),
        ("typical gain", _typical(fix)),
    ]
    if fix.target != _default(fix, "target"):  # the default names nothing
        facts.append(("acts on", _text(fix.target)))
    if fix.removes < 1:
        facts.append(("removes at most", f"{fix.removes:.0%} of the finding's share"))
    if fix.phases:
        facts.append(("phases", ", ".join(f"`{p}`" for p in fix.phases)))
    if fix.needs:
        facts.append(("needs", f"[`{fix.needs}`](#{fix.needs})"))
    out += ["| | |", "| --- | --- |", *(f"| {k} | {_cell(v)} |" for k, v in facts), ""]
    doc = inspect.getdoc(module)
    if doc:
        out += ['??? note "Notes from the module"', ""]
        out += [f"    {line}" if line else "" for line in doc.splitlines()]
        out.append("")
    if fix.snippet:
        out += ["```python", fix.snippet.strip("\n"), "```", ""]
    return out


def _default(fix: Any, name: str) -> Any:
    return next(f.default for f in dataclasses.fields(fix) if f.name == name)


def _way_in(fix: Any) -> str:
    if not fix.auto:
        return "advice: a code change, never applied by stepscope"
    ways = [text for hook, text in WAYS_IN.items() if getattr(fix, hook, None) is not None]
    if fix.env:
        ways.append(f"the variable `{fix.env[0]}`, set by the runner")
    return "automatically, through " + ("; ".join(ways) or "the installer")


def _typical(fix: Any) -> str:
    typical = fix.typical
    if typical is None:
        return "no cited figure: the Amdahl bound from the finding's share"
    return f"{typical.lo:g}x to {typical.hi:g}x ({_text(typical.source)})"
