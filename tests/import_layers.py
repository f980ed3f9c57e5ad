"""The layers of stepscope's packages, and a check of its imports against them.

A package may import from its own layer and the layers below it, never from one above:
that is what keeps the analyzers from importing the optimiser and the optimiser the
dashboard, and it rules out every cycle between packages. Function-local imports count
the same as top-level ones (they are where cycles used to hide), and each local import
of a stepscope module must say why it is local, in a comment on its line or the line
before (start-up cost inside the user's job is the usual reason).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

# Lowest first. ``stepscope.types`` and ``stepscope.errors`` are plain modules every
# layer may use; the package's own ``__init__`` and ``api`` are the notebook API over all.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("stepscope.types", "stepscope.errors"),
    ("stepscope.store",),
    ("stepscope.fixes",),
    ("stepscope.collectors",),
    # the analyzers, by what each reads: a trace's events, then the hardware's roofs
    # and the run's steps over them, the report over all of those, the rules on top
    ("stepscope.analyzers", "stepscope.analyzers.trace"),
    ("stepscope.analyzers.hardware", "stepscope.analyzers.steps"),
    ("stepscope.analyzers.report",),
    ("stepscope.analyzers.rules",),
    ("stepscope.optim_runner",),
    ("stepscope.app",),
    ("stepscope", "stepscope.api"),
)


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the imported module
    line: int
    local: bool  # inside a function
    reason: bool  # a comment on its line or the line before


def layer_of(module: str) -> int:
    """Index in LAYERS of the longest prefix that names a layer."""
    best, depth = len(LAYERS) - 1, -1
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and name.count(".") > depth:
                best, depth = i, name.count(".")
    return best


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(root: Path) -> list[Import]:
    """Every import of a module of the package ``root`` (a folder such as stepscope/)."""
    package = root.name
    found: list[Import] = []
    for path in sorted(root.rglob("*.py")):
        module = module_name(path, root)
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        tree = ast.parse(source)
        local_nodes = {
            id(node)
            for fn in ast.walk(tree)
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
            for node in ast.walk(fn)
        }
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = module.split(".")
                    if path.name != "__init__.py":
                        base = base[:-1]
                    base = base[: len(base) - node.level + 1]
                    stem = ".".join(base + ([node.module] if node.module else []))
                else:
                    stem = node.module or ""
                # ``from stepscope import fixes`` imports the package stepscope.fixes, and
                # ``from stepscope import __version__`` the root package (its ``__init__``,
                # which imports nothing eagerly: any layer may read the version)
                targets = [stem]
                if stem == package:
                    targets = [
                        f"{stem}.{a.name}"
                        for a in node.names
                        if (root / a.name).is_dir() or (root / f"{a.name}.py").is_file()
                    ] or [stem]
            for target in targets:
                if not target.startswith(package + "."):
                    continue  # another package's, or the root package's own names
                here = lines[node.lineno - 1]
                before = lines[node.lineno - 2] if node.lineno > 1 else ""
                reason = "#" in here or before.strip().startswith("#")
                found.append(Import(module, target, node.lineno, id(node) in local_nodes, reason))
    return found


def violations(root: Path) -> list[str]:
    """One line per import that goes up a layer, and per local import without a reason."""
    out = []
    for imp in imports(root):
        if layer_of(imp.target) > layer_of(imp.module):
            out.append(
                f"{imp.module}:{imp.line} imports {imp.target}, a layer above it "
                f"({LAYERS[layer_of(imp.target)][0]} over {LAYERS[layer_of(imp.module)][0]})"
            )
        if imp.local and not imp.reason:
            out.append(
                f"{imp.module}:{imp.line} imports {imp.target} inside a function, no reason given"
            )
    return out
