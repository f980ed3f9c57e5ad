"""stepscope bootstrap: this directory is put first on PYTHONPATH by `stepscope run`.

Python imports ``sitecustomize`` from the first directory on ``sys.path`` that has one,
so this file shadows any sitecustomize the user (or their distribution) already had.
It therefore does two things only, each unable to break the job: install the
collectors, then run the shadowed sitecustomize as if ours were not there.
No stepscope import happens at module level: this file must work even when the
package is broken or missing.
"""

import contextlib
import os
import sys


def _stepscope_install() -> None:
    if not os.environ.get("STEPSCOPE_RUN_ID") or os.environ.get("STEPSCOPE_DISABLE") == "1":
        return
    try:
        try:
            import stepscope  # noqa: F401
        except ImportError:
            pkg = os.environ.get("STEPSCOPE_PACKAGE_PATH")
            if not pkg:
                raise
            sys.path.append(pkg)
            import stepscope  # noqa: F401
        # local: inside the try, so that a broken or missing stepscope leaves the job alone
        from stepscope.collectors.injob import bootstrap

        bootstrap.install()
    except BaseException as exc:  # noqa: BLE001 - the job must start whatever happens here
        with contextlib.suppress(Exception):
            sys.stderr.write(f"stepscope: bootstrap disabled ({type(exc).__name__}: {exc})\n")


def _chain_to_shadowed_sitecustomize() -> None:
    """Exec the next ``sitecustomize`` on sys.path after this file's directory."""
    try:
        import importlib.machinery
        import importlib.util

        here = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
        entries = []
        seen_self = False
        for entry in sys.path:
            try:
                real = os.path.realpath(entry or os.getcwd())
            except (OSError, ValueError):
                continue
            if real == here:
                seen_self = True
                continue
            if seen_self:
                entries.append(entry)
        if not seen_self:
            return
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", entries)
        if spec is None or spec.loader is None:
            return
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)
    except Exception:
        # Same contract as Python's own site.py: report a failing sitecustomize, go on.
        import traceback

        sys.stderr.write(
            "Error in sitecustomize (chained by stepscope); set PYTHONVERBOSE for traceback:\n"
        )
        sys.stderr.write("".join(traceback.format_exception_only(*sys.exc_info()[:2])))


_stepscope_install()
_chain_to_shadowed_sitecustomize()
