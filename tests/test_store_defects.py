"""What a shared store may hold that stepscope never wrote (issue 36, item 8): evidence
text with HTML in it is shown as text, never as markup; a meta table whose
``schema_version`` is no number is one line naming the store and the value, on every
command and every page, on both backends."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from dashboard_helpers import open_page

from stepscope.analyzers.rules.diagnosis import DIAGNOSED
from stepscope.app.cli.main import main
from stepscope.store import RunStore, StoreError
from stepscope.types import BottleneckClass, EvidenceItem, Finding

XSS_TEXT = "<img src=x onerror=alert(1)>"
XSS_SOURCE = "<script>alert(2)</script>"
IMAGE_TEXT = "![x](http://attacker.invalid/pixel.png)"


def test_evidence_from_the_store_is_escaped_on_the_run_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    finding = Finding(
        BottleneckClass.IO,
        "input_pipeline",
        "Waiting for data",
        share=0.4,
        confidence=0.9,
        evidence=[
            EvidenceItem(XSS_TEXT, 0.4, XSS_SOURCE),
            EvidenceItem("a < b & c", None, ""),
            EvidenceItem(IMAGE_TEXT, None, ""),
        ],
    )
    with RunStore(home) as store:  # as a job with write access to the store would write it
        run_id = store.create_run(["python", "train.py"], name="xss", status="completed")
        store.finish_run(run_id, "completed", exit_code=0)
        store.save_findings(run_id, [finding])
        marker = {"at": time.time() + 60, "level": "steps", "reason": None}
        store.merge_run_json(run_id, "config", {DIAGNOSED: marker})
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    at = open_page("run", run=str(run_id))
    assert not at.exception
    bodies = [m.value for m in at.markdown]
    evidence = next(b for b in bodies if "onerror" in b)
    assert "<img" not in evidence and "<script" not in evidence
    assert "&lt;img src=x onerror=alert(1)&gt;" in evidence
    assert "<small>· &lt;script&gt;alert(2)&lt;/script&gt;</small>" in evidence
    assert "- a &lt; b &amp; c" in evidence  # shown as written once the page decodes it
    assert not [b for b in bodies if "<img" in b or "<script" in b]
    assert "- !\\[x\\](http://attacker.invalid/pixel.png)" in evidence  # no markdown image


def _spoil_schema_version(home: Path) -> str:
    """A store of one run whose meta table says 'eight'; returns where the store is."""
    with RunStore(home) as store:
        run_id = store.create_run(["python", "train.py"], name="r", status="completed")
        store.finish_run(run_id, "completed", exit_code=0)
        store._db.execute("UPDATE meta SET value='eight' WHERE key='schema_version'")
        return store.location


COMMANDS = [
    ["runs"],
    ["show", "last"],
    ["analyze", "last"],
    ["capture", "last"],
    ["optimize", "last"],
    ["check", "last", "--against", "last"],
    ["diff", "last", "last"],
    ["tag", "last", "base"],
    ["tag", "--list"],
    ["trust", "last"],
]


def test_a_bad_schema_version_is_one_line_on_every_command(
    store_backend: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    where = _spoil_schema_version(home)
    with pytest.raises(StoreError, match="schema_version is 'eight', not a version number"):
        RunStore(home)
    for args in COMMANDS:
        code = main(["--home", str(home), *args])
        out, err = capsys.readouterr()
        assert code != 0 and out == "", args
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in err, (args, err)
        assert where in lines[0] and "'eight'" in lines[0], (args, lines[0])


@pytest.mark.parametrize("page", ["runs", "run", "compare", "optimize"])
def test_a_bad_schema_version_is_one_line_on_every_page(
    page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    where = _spoil_schema_version(home)
    monkeypatch.setenv("STEPSCOPE_HOME", str(home))
    at = open_page(page)
    assert not at.exception, [e.value for e in at.exception]
    assert len(at.error) == 1
    assert where in at.error[0].value and "'eight'" in at.error[0].value
