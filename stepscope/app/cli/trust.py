"""`stepscope trust RUN`: sign a run's command after its owner has read it, at a terminal.

stepscope re-runs only what its user's key signed (``store/signing.py``). A run recorded
before runs were signed, or one whose key has changed, is refused until its owner looks
at what a replay would run and says yes. That look is the point: the command is shown
exactly as it would be started, with its folder and variables, and the answer must come
from a person at a terminal, never from a pipe or a script, so nothing that can write the
store can also sign for it. The values shown are the values signed; a row changed
between the two no longer matches its signature and is refused again.
"""

from __future__ import annotations

import datetime as dt
import shlex
import sys

from stepscope.app.cli.exit_codes import EXIT_REFUSED
from stepscope.app.ownership import this_host, this_user
from stepscope.store import RunStore
from stepscope.store.identity import current_user
from stepscope.store.signing import sign, signature_refusal, signed_values
from stepscope.store.user_key import KeyFileError

EXIT_DECLINED = 1


def cmd_trust(ref: str) -> int:
    """Show run ``ref``'s replay and sign it on a yes; exit 0 signed (or already), 1
    declined, 2 refused (not the owner's, or no terminal). RunNotFound propagates."""
    with RunStore() as store:
        run_id = store.resolve_run(ref)
        run = store.run(run_id)
        values = signed_values(run)
        if values["user"] != current_user() or values["host"] != this_host():
            return _refuse(
                run_id,
                f"recorded by {values['user'] or 'an unknown user'} on {values['host']}: only "
                f"its owner can sign it, on its host (you are {this_user()} on {this_host()})",
            )
        if signature_refusal(run) is None:
            print(f"run {run_id} is signed as it stands: nothing to do")
            return 0
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            return _refuse(run_id, "signing needs you at a terminal to confirm it")
        _show(run, values)
        try:
            answer = input("Sign it, so that stepscope may run this command again? [y/N] ")
        except EOFError:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            print(f"run {run_id} not signed")
            return EXIT_DECLINED
        try:
            store.update_run(run_id, signature=sign(run_id, values))
        except KeyFileError as exc:
            return _refuse(run_id, str(exc))
    print(f"run {run_id} signed: stepscope optimize {run_id} may re-run it")
    return 0


def _show(run: dict, values: dict) -> None:
    started = dt.datetime.fromtimestamp(float(run["started_at"])).isoformat(" ", "seconds")
    print(f"run {run['id']} ({run['name']}), recorded {started} by {values['user']}")
    print(f"  command  {shlex.join(values['command'] or [])}")
    print(f"  folder   {values['cwd']}")
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in values["env"].items())
    print(f"  env      {env or '(none of the recorded variables)'}")
    why = str(signature_refusal(run)).split("; `stepscope trust")[0]
    print(f"  refused  {why}")


def _refuse(run_id: int, why: str) -> int:
    print(f"stepscope: cannot trust run {run_id}: {why}", file=sys.stderr)
    return EXIT_REFUSED


__all__ = ["cmd_trust"]
