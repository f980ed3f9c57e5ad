"""What differs between two runs, in words: setting names a reader says, no JSON paths
(``applied[1].applied``) and no Python repr (None, True) in the Compare page's rows."""

from __future__ import annotations

from stepscope.app.dashboard.views.compare.run_diff import flatten, json_diff

BASELINE = {"arm": "baseline", "fixes": [], "max_steps": 40, "applied": [{"fix": "seed"}]}
TRIAL = {
    "arm": "all",
    "fixes": ["dataloader_workers", "pin_memory"],
    "max_steps": 40,
    "applied": [
        {"fix": "seed"},
        {"fix": "dataloader_workers", "change": "num_workers 0 -> 4", "applied": True},
        {"fix": "pin_memory", "change": "not applied: no CUDA device", "applied": False},
    ],
}


def test_settings_are_named_not_json_paths() -> None:
    rows = {r["setting"]: (r["A"], r["B"]) for r in json_diff(BASELINE, TRIAL).to_dict("records")}
    assert rows == {
        "applied › dataloader_workers": ("—", "num_workers 0 -> 4"),
        "applied › pin_memory": ("—", "not applied: no CUDA device"),
        "arm": ("baseline", "all"),
        "fixes": ("none", "dataloader_workers, pin_memory"),
    }


def test_leaves_are_words() -> None:
    facts_a = {"dataloaders": [{"num_workers": 0, "pin_memory": False, "prefetch_factor": None}]}
    facts_b = {"dataloaders": [{"num_workers": 4, "pin_memory": True, "prefetch_factor": 4}]}
    diff = json_diff(facts_a, facts_b)
    assert set(diff["setting"]) == {
        "dataloaders › 1 › num_workers",
        "dataloaders › 1 › pin_memory",
        "dataloaders › 1 › prefetch_factor",
    }
    shown = set(diff["A"]) | set(diff["B"])
    assert shown == {"0", "4", "no", "yes", "—"}
    assert not any(x in ("None", "True", "False") for x in shown)


def test_nested_objects_keep_their_path() -> None:
    assert flatten({"settings": {"threads": 2, "tf32": {}}}) == {
        "settings › threads": 2,
        "settings › tf32": "none",
    }
