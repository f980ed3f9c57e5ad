"""Compare: two runs side by side (``?a=BASELINE&b=CANDIDATE``).

With one of them or neither in the URL, ``compare_pair`` picks the pair (a run of the
same command for the one named) and puts the baseline as A, and the page says when the
two commands differ: a ratio between two different jobs is no measurement of anything.

The headline is throughput, as experiments decide it (``optim_runner/speedup/speed.py``): the
ratio of mean seconds per sample with a bootstrap interval, the median step-time ratio
beside it; two single figures of a noisy machine say little on their own, so a ratio whose
interval contains 1 is reported as no measurable change.
For two inference runs the p50 and p99 latency ratios (A/B, with their intervals) come
beside throughput: a change can serve more requests per second and still lengthen the tail.
Two generation runs are compared by their requests instead (``generation_pair``): tokens/s,
TTFT, TPOT and request p50/p99, each with its interval and its timed requests.
The breakdowns are compared on the same basis for both runs: the trace engine's
categories when both have a trace, else the step timer's data wait / compute. Where the
time went, operator by operator and phase by phase with intervals, is ``compare_ops``.
"""

from __future__ import annotations

import streamlit as st

from stepscope.analyzers.steps.generation import is_generation
from stepscope.analyzers.trace.breakdown import CATEGORIES
from stepscope.app.applied import applied_changes, state
from stepscope.app.dashboard import compare_pair, data, trace_data, ui
from stepscope.app.dashboard.charts.compare import (
    breakdown_compare,
    loss_overlay,
    step_time_distributions,
)
from stepscope.app.dashboard.charts.system import system_timelines
from stepscope.app.dashboard.views.compare import compare_ops, generation_pair, run_diff
from stepscope.app.dashboard.views.run import trace_sections
from stepscope.app.formats import fmt_num, fmt_s, speed_caption
from stepscope.optim_runner.speedup.speed import LATENCY_RATIOS, compare_speed
from stepscope.optim_runner.speedup.stats import timed_step_times

home = data.store_home()
st.title("Compare")

with ui.errors_as_one_line():
    choices = data.run_choices(home)
if len(choices) < 2:
    st.info(
        "Comparing needs two runs; this store has "
        + ("none yet." if choices.empty else "one.")
        + " Record the job again with one thing changed, for example:",
        icon=":material/compare_arrows:",
    )
    st.code(
        "stepscope run -- python train.py\nstepscope run -- python train.py --num-workers 4",
        language="bash",
    )
    st.stop()

ids = [int(i) for i in choices["id"]]
names = dict(zip(ids, choices["name"], strict=True))
statuses = dict(zip(ids, choices["status"], strict=True))


def _asked(key: str) -> int | None:
    """The run the URL names for ``key``; one line and stop when there is none such."""
    value = ui.query_int(key)
    if value is not None and value not in ids:
        ui.fail(f"no run with id {value} in {home} (?{key}={value})")
    return value


# Both named (a link from an experiment, or this page's own URL): shown as asked. One
# named ("Compare with…" on a run's page sends ?b=) or none: the pair and its order are
# compare_pair's, so the ratio always reads candidate vs baseline.
asked_a, asked_b = _asked("a"), _asked("b")
with ui.errors_as_one_line():
    relations = data.run_relations(home)
if asked_a is not None and asked_b is not None:
    a_default, b_default = asked_a, asked_b
else:
    fixed = asked_a if asked_a is not None else asked_b
    pair = compare_pair.default_pair(relations, fixed, ids)
    a_default, b_default = pair if pair is not None else (ids[1], ids[0])


def _label(i: int) -> str:
    return f"#{i} {names[i]} ({statuses[i]})"


c1, c2 = st.columns(2)
a = c1.selectbox("A: baseline", ids, index=ids.index(a_default), format_func=_label)
b = c2.selectbox("B: candidate", ids, index=ids.index(b_default), format_func=_label)
ui.set_query(a=a, b=b)
# Like with like: a ratio between two programs (two folders' ``main.py``) measures no
# change, so the page then leads with what differs and gives no faster/slower verdict.
# A run against itself, or a run with no folder recorded: one line, the rest shown.
same_run = a == b
other_program = False
note = None
if same_run:
    st.info(
        f"A and B are the same run (#{a}): no comparison to show; pick another run as B. "
        "Below are that run's own figures.",
        icon=":material/info:",
    )
elif a in relations and b in relations:
    ra, rb = relations[a], relations[b]
    other_program = compare_pair.closeness(ra, rb) == compare_pair.OTHER_JOB
    if other_program:
        st.warning(
            "These are different programs: no faster/slower verdict, their figures side by "
            "side only.\n"
            + "\n".join(f"- {d}" for d in compare_pair.differences(ra, rb) or ["the command"]),
            icon=":material/warning:",
        )
    else:
        note = compare_pair.command_note(ra, rb)
        if note is not None:
            st.caption(note[0] + ".")
    missing_folder = compare_pair.no_folder(ra, rb)
    if missing_folder and not other_program:
        st.caption(
            "Run #"
            + " and #".join(map(str, missing_folder))
            + " recorded no working folder: whether A and B ran the same script cannot be told."
        )
verdict = not same_run and not other_program

with ui.errors_as_one_line():
    markers = (data.run_marker(data.run_header(home, a)), data.run_marker(data.run_header(home, b)))
    da = data.run_data(home, a, markers[0])
    db = data.run_data(home, b, markers[1])
label_a, label_b = f"A #{a} {names[a]}", f"B #{b} {names[b]}"

# -- speed ------------------------------------------------------------------------------
ta, tb = timed_step_times(da.steps), timed_step_times(db.steps)
st.subheader("Speed")
speed = compare_speed(da.steps, db.steps)
generation = is_generation(da.steps) and is_generation(db.steps)
with ui.errors_as_one_line():  # two generation runs: their requests' figures instead
    generation = generation and generation_pair.show(home, a, b, markers, verdict)
if speed.problem and verdict and not generation:
    st.info(f"No speed ratio: {speed.problem}.")
if not generation:
    cols = st.columns(5)
    cols[0].metric("median step A", fmt_s(da.summary["step_time_median_s"]))
    cols[1].metric("median step B", fmt_s(db.summary["step_time_median_s"]))
    if speed.headline is not None and verdict:
        ui.ratio_metric(
            cols[2],
            "speed-up B vs A",
            speed.headline,
            help=(
                "throughput: mean seconds per sample A/B (what an epoch's wall time follows)"
                if speed.throughput is not None
                else "median step time A/B (no batch sizes recorded for throughput)"
            )
            + "; > 1 means B is faster",
        )
    if speed.throughput is not None and speed.step_time is not None and verdict:
        ui.ratio_metric(
            cols[3],
            "median step-time ratio",
            speed.step_time,
            help="median step time A/B: the typical step; flatters fixes that make steps bimodal",
        )
    sa, sb = da.summary["samples_per_s"], db.summary["samples_per_s"]
    cols[4].metric(
        "samples/s A → B",
        f"{fmt_num(sa)} → {fmt_num(sb)}",
        help="throughput over the timed steps, all ranks",
    )
    if speed.headline is not None and verdict:
        st.caption(speed_caption(speed))
    if speed.latency is not None and verdict:
        lat_a, lat_b = da.summary["latency"] or {}, db.summary["latency"] or {}
        lat_cols = st.columns(2 * len(LATENCY_RATIOS))
        for i, name in enumerate(LATENCY_RATIOS):
            key = f"{name}_s"
            lat_cols[2 * i].metric(
                f"latency {name} A → B",
                f"{fmt_s(lat_a.get(key))} → {fmt_s(lat_b.get(key))}",
                help="the whole iteration of each timed request or batch",
            )
            ci = speed.latency[name]
            if ci is not None:
                ui.ratio_metric(
                    lat_cols[2 * i + 1],
                    f"latency {name} ratio",
                    ci,
                    help=f"{name} latency A/B; > 1 means B's requests return sooner",
                )
        described = [f"{n}: {ci.describe()}" for n, ci in speed.latency.items() if ci is not None]
        if described:
            st.caption(
                "Latency (inference runs: each step one request or batch): "
                + "; ".join(described)
                + ". Bootstrap over each run's timed steps; a tail percentile of a short run "
                "rests on its few slowest steps."
            )

# -- breakdown before / after ------------------------------------------------------------------
st.subheader("Where the step time goes")


held: list[int] = []  # runs whose trace waits for its click (too big) or is refused


def _trace_shares(d: data.RunData) -> dict[str, float] | None:
    paths, _ = trace_data.trace_files(d)
    if not paths:
        return None
    try:
        stamp = trace_data.file_stamp(paths)
        if not trace_sections.analysis_allowed(stamp, f"Run {d.run['id']}'s trace"):
            held.append(int(d.run["id"]))
            return None
        return dict(trace_data.trace_report(stamp).breakdown)
    except data.user_errors() as exc:
        st.warning(f"run {d.run['id']}: trace not analysed: {data.one_line(exc)}")
        return None


shares_a, shares_b = _trace_shares(da), _trace_shares(db)
if shares_a is not None and shares_b is not None:
    st.plotly_chart(
        breakdown_compare({label_a: shares_a, label_b: shares_b}, CATEGORIES),
        key="breakdown_compare",
    )
    st.caption("From each run's profiler trace (trace engine categories).")
else:
    wa, wb = da.summary["data_wait_share"], db.summary["data_wait_share"]
    if wa is None or wb is None:
        st.info("Not enough timed steps in one of the runs for a breakdown.")
    else:
        basis = {
            label_a: {"data wait": wa, "compute": 1 - wa},
            label_b: {"data wait": wb, "compute": 1 - wb},
        }
        st.plotly_chart(breakdown_compare(basis, ["data wait", "compute"]), key="breakdown_compare")
        st.caption(
            "From the step timer (data wait / the rest), since "
            + ("neither run has" if shares_a is None and shares_b is None else "only one run has")
            + " a profiler trace."
        )

left, right = st.columns(2)
with left:
    inference = speed.latency is not None
    st.markdown(
        "**Latency distributions** (timed requests)"
        if inference
        else "**Step-time distributions** (timed steps)"
    )
    st.plotly_chart(step_time_distributions({label_a: ta, label_b: tb}), key="distributions")
with right:
    st.markdown("**Loss**")
    fig = loss_overlay({label_a: da.steps, label_b: db.steps})
    if fig is None:
        st.info("Neither run recorded a loss.")
    else:
        st.plotly_chart(fig, key="loss")

# -- operator by operator -----------------------------------------------------------------------
if held:  # the diff loads both traces: not before the click
    st.subheader("Where the time went")
    st.info(
        "No operator diff: the trace of run "
        + " and run ".join(map(str, held))
        + " is not analysed (see above).",
        icon=":material/info:",
    )
elif other_program:  # its rows are "faster"/"slower" verdicts too: none between programs
    st.subheader("Where the time went")
    st.info(
        "No operator diff: A and B are different programs, so their operators' times "
        "are not the effect of one change.",
        icon=":material/info:",
    )
else:
    compare_ops.show(home, a, b, markers, commands_noted=note is not None)

st.subheader("System")
fig = system_timelines(
    {
        label_a: (da.samples, float(da.run["started_at"])),
        label_b: (db.samples, float(db.run["started_at"])),
    }
)
if fig is None:
    st.info("Neither run has system samples.")
else:
    st.plotly_chart(fig, key="system_compare")

# -- what changed -------------------------------------------------------------------------------
st.subheader("What changed")
if other_program:  # another script is no edit of one command ("removed --no-accel")
    edits = compare_pair.differences(relations[a], relations[b])
    st.markdown("**program** (different programs)\n" + "\n".join(f"- `{e}`" for e in edits))
else:
    edits = run_diff.command_diff(list(da.run["command"]), list(db.run["command"]))
    if edits:
        st.markdown("**command**\n" + "\n".join(f"- `{e}`" for e in edits))
    else:
        st.caption("Same command.")
for label, d in ((label_a, da), (label_b, db)):
    changes = applied_changes(d.run.get("config"))
    if changes:
        st.markdown(
            f"**fixes applied in {label}**\n"
            + "\n".join(f"- `{c['fix']}`: {c['change']} ({state(c)})" for c in changes)
        )
for column, what in (
    ("config", "stepscope options"),
    ("facts", "the job's settings"),
    ("device", "torch and devices"),
):
    diff = run_diff.json_diff(da.run.get(column) or {}, db.run.get(column) or {})
    if diff.empty:
        st.caption(f"{column} ({what}): no difference.")
    else:
        st.markdown(f"**{column}** ({what})")
        st.dataframe(diff, hide_index=True)
