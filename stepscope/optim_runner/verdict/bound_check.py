"""A measured gain above its predicted bound: say which side the data says is off.

The diagnosis bounds each fix's gain (Amdahl: removing a 30 % share bounds the speed-up
at 1/0.7). A measurement whose whole confidence interval lies above that bound means
one of three things, and the experiment's own data tell them apart:

* the diagnosed run was recorded under other conditions: the bound recomputed from the
  experiment's baseline trials (``predicted_in_experiment``, input-pipeline fixes)
  holds what was measured, so the diagnosis's share, not the measurement, was off;
* the baseline trials were slower than the diagnosed run (a busier machine, an
  unlucky draw): the ratio is inflated by the baseline;
* neither: the fix removes more than the finding's share (it also speeds up work
  outside it), so the bound's basis understates it.
"""

from __future__ import annotations

from typing import Any

# Baseline trials this much slower (median step) than the diagnosed run were run under
# other conditions.
SLOWER_BASELINE = 1.2


def above_bound_note(
    fix: dict[str, Any], trials_median_s: float | None, diagnosed_median_s: float | None
) -> str | None:
    """A sentence when the measured interval lies wholly above the predicted bound."""
    bound, measured, ci = fix.get("predicted"), fix.get("measured"), fix.get("ci")
    if bound is None or measured is None or not ci or ci[0] <= bound:
        return None
    head = (
        f"measured {measured:.2f}x (CI {ci[0]:.2f}-{ci[1]:.2f}x) is above the bound of {bound:.2f}x"
    )
    here = fix.get("predicted_in_experiment")
    if here is not None and ci[0] <= here:
        return (
            f"{head} from the diagnosed run, but within the {here:.2f}x bound from this "
            "experiment's own baseline trials: the diagnosed run was recorded under other "
            "conditions, so the diagnosis's share was off, not the measurement"
        )
    if (
        trials_median_s is not None
        and diagnosed_median_s
        and trials_median_s > SLOWER_BASELINE * diagnosed_median_s
    ):
        return (
            f"{head}: the baseline trials were slower than the diagnosed run (median step "
            f"{1e3 * trials_median_s:.1f} ms vs {1e3 * diagnosed_median_s:.1f} ms), so an "
            "unlucky or busier baseline inflates the ratio; re-run to confirm"
        )
    return (
        f"{head}, with baseline trials as fast as the diagnosed run: the fix removes more "
        f"than the share of its finding ({fix.get('finding') or 'unknown'}), so the bound's "
        "basis understates it"
    )


__all__ = ["above_bound_note"]
