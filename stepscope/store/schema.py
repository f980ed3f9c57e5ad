"""The run store's schema, one text for both backends.

The database is the spine every stage reads and writes: the launcher, each rank of a
job, the system sampler and the dashboard all open it at the same time (SQLite in WAL
mode with a busy timeout, or a PostgreSQL server shared by many hosts).
The DDL is written in SQLite's words; ``ddl_for`` gives PostgreSQL its own types
(``REAL`` is float4 there, which would cut unix seconds to minutes: it becomes
DOUBLE PRECISION). Bump SCHEMA_VERSION with every change and add the step to
MIGRATIONS; a PostgreSQL store starts at version 5, so migrations from 5 on must be
portable SQL.
"""

from __future__ import annotations

import re

SCHEMA_VERSION = 10

# Statuses a run can have. "running" is the only non-final one; a run whose launcher
# vanished without finalising is turned into "lost" on the next read.
RUN_STATUSES = ("running", "completed", "failed", "stopped", "interrupted", "killed", "lost")
EXPERIMENT_STATUSES = ("running", "completed", "failed")

DDL = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE IF NOT EXISTS runs (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    name            TEXT NOT NULL,
    command         TEXT NOT NULL,          -- JSON list of argv
    cwd             TEXT NOT NULL,
    status          TEXT NOT NULL DEFAULT 'running',
    exit_code       INTEGER,
    error           TEXT,                   -- one line: why it failed
    stop_reason     TEXT,                   -- e.g. 'max_steps' when stepscope stopped it
    started_at      REAL NOT NULL,          -- unix seconds
    ended_at        REAL,
    host            TEXT NOT NULL,
    pid             INTEGER,                -- the launcher's pid (liveness check)
    pid_started_at  REAL,                   -- its create time, against pid reuse
    max_steps       INTEGER,
    env             TEXT NOT NULL DEFAULT '{}',   -- JSON: python, platform, relevant env vars
    device          TEXT NOT NULL DEFAULT '{}',   -- JSON: torch, cuda, device names (from the job)
    config          TEXT NOT NULL DEFAULT '{}',   -- JSON: stepscope options of this run
    facts           TEXT NOT NULL DEFAULT '{}',   -- JSON: the job's settings (DataLoader,
                                                  -- optimizer, model, precision), see job_facts
    parent_run_id   INTEGER REFERENCES runs(id),  -- baseline a re-run derives from
    "user"          TEXT,                   -- who started it (a shared store has many)
    run_group       TEXT,                   -- one run of a multi-node job: its launchers'
                                            -- shared key (NULL: an ordinary run)
    signature       TEXT                    -- its recorder's HMAC over what a replay runs
                                            -- (app/trust.py); NULL: never signed
);

CREATE TABLE IF NOT EXISTS steps (
    run_id       INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    rank         INTEGER NOT NULL DEFAULT 0,
    -- 0: the rank's own process; N: the training process multiprocessing numbered N
    -- (a hogwild worker, a Pool worker: processes of the job that train without a rank)
    worker       INTEGER NOT NULL DEFAULT 0,
    step         INTEGER NOT NULL,          -- 0-based, per rank and worker
    start_s      REAL NOT NULL,             -- unix seconds (host clock)
    end_s        REAL NOT NULL,
    data_wait_s  REAL NOT NULL DEFAULT 0,   -- time inside DataLoader iterator __next__
    device_s     REAL,                      -- step time from CUDA events, when on CUDA
    batch_size   INTEGER,
    loss         REAL,
    kind         TEXT NOT NULL,             -- 'optimizer' | 'forward' | 'mark'
    profiled     INTEGER NOT NULL DEFAULT 0, -- 1 when inside a profiler capture window
    -- phases, exclusive host-clock seconds (collectors/steps/step_accounting.py); NULL: not
    -- recorded (a run older than version 4, an attached process)
    forward_s    REAL,                      -- inside the outermost module calls
    backward_s   REAL,                      -- inside Tensor.backward / autograd.backward
    optimizer_s  REAL,                      -- inside optimizer.step() and zero_grad()
    PRIMARY KEY (run_id, rank, worker, step)
);

CREATE TABLE IF NOT EXISTS samples (
    run_id  INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    t       REAL NOT NULL,                  -- unix seconds
    scope   TEXT NOT NULL,                  -- 'proc' | 'system' | 'gpu0', 'gpu1', ...
    metric  TEXT NOT NULL,                  -- e.g. 'cpu_percent', 'rss_bytes', 'util_percent'
    value   REAL,
    host    TEXT                            -- NULL: the run's host
);  -- unique key: samples_key (INDEXES), which also serves reads by run in time order

CREATE TABLE IF NOT EXISTS artifacts (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    kind        TEXT NOT NULL,              -- 'trace' | 'memory_snapshot' | ...
    path        TEXT NOT NULL,
    rank        INTEGER NOT NULL DEFAULT 0,
    created_at  REAL NOT NULL,
    meta        TEXT NOT NULL DEFAULT '{}'
);

CREATE TABLE IF NOT EXISTS events (
    run_id   INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    t        REAL NOT NULL,
    rank     INTEGER,
    level    TEXT NOT NULL,                 -- 'info' | 'warning' | 'error'
    source   TEXT NOT NULL,                 -- which collector or stage
    message  TEXT NOT NULL
);  -- unique key: events_key (INDEXES), which also serves reads by run in time order

-- The diagnosis of a run, most costly finding first (position 0). Replaced as a whole
-- each time the run is diagnosed again (more evidence: a new capture).
CREATE TABLE IF NOT EXISTS findings (
    run_id      INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    position    INTEGER NOT NULL,
    class       TEXT NOT NULL,              -- 'io' | 'compute' | 'memory' | 'communication'
    subtype     TEXT NOT NULL,              -- the taxonomy (docs/architecture.md), e.g. 'input_pipeline'
    title       TEXT NOT NULL,
    share       REAL,                       -- share of step time it costs (0..1)
    confidence  REAL NOT NULL,              -- 0..1
    level       TEXT NOT NULL,              -- evidence: 'samples' | 'stacks' | 'steps' | 'trace'
    evidence    TEXT NOT NULL DEFAULT '[]', -- JSON list of {text, value, source}
    fixes       TEXT NOT NULL DEFAULT '[]', -- JSON list of recommended fixes
    created_at  REAL NOT NULL,
    phase       TEXT,                       -- the step phase it lives in ('forward', ...)
    PRIMARY KEY (run_id, position)
);

-- Experiments (`stepscope optimize`): a baseline re-run beside candidates with fixes
-- applied. The trial runs are ordinary runs (parent_run_id = the baseline, their arm
-- in config); this row holds what ties them together. ``progress`` is rewritten as
-- each trial starts and ends, so a dashboard can poll it; ``pid`` lets a reader tell
-- a running experiment from one whose process was killed (as for runs).
CREATE TABLE IF NOT EXISTS experiments (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    baseline_run_id  INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    status           TEXT NOT NULL DEFAULT 'running',  -- 'running' | 'completed' | 'failed'
    error            TEXT,                   -- one line: why it failed
    created_at       REAL NOT NULL,
    ended_at         REAL,
    host             TEXT NOT NULL,
    pid              INTEGER,                -- the process running it (liveness check)
    pid_started_at   REAL,
    config           TEXT NOT NULL DEFAULT '{}',  -- JSON: fixes, steps, trials, timeout, ...
    progress         TEXT NOT NULL DEFAULT '{}',  -- JSON: done/total trials, current arm
    result           TEXT NOT NULL DEFAULT '{}'   -- JSON: candidates, best, predicted vs measured
);
CREATE INDEX IF NOT EXISTS experiments_baseline ON experiments(baseline_run_id);

-- Python stack samples of an attached process (py-spy, collectors/samplers/stack_sampler.py).
-- A loop repeats a few hundred distinct stacks, so each is stored once per run and the
-- windows count samples of it: a ten-minute attach stays a few hundred KB.
CREATE TABLE IF NOT EXISTS stacks (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id  INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    frames  TEXT NOT NULL,                  -- outermost first, 'func (file:line)' joined by ';'
    UNIQUE (run_id, frames)
);
CREATE TABLE IF NOT EXISTS stack_samples (
    run_id    INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    t_start   REAL NOT NULL,                -- the sampling window, unix seconds
    t_end     REAL NOT NULL,
    pid       INTEGER NOT NULL,
    tid       INTEGER NOT NULL,             -- OS thread id (the main thread's is the pid)
    thread    TEXT NOT NULL,                -- thread name, e.g. 'MainThread'
    stack_id  INTEGER NOT NULL REFERENCES stacks(id) ON DELETE CASCADE,
    samples   INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS stack_samples_run ON stack_samples(run_id, t_start);

-- The launchers of one run (a multi-node job: one `stepscope run` per node, joined by
-- run_group). The run is finalised when its last member finishes; liveness is checked
-- per member, on the member's own host.
CREATE TABLE IF NOT EXISTS run_members (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id          INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    host            TEXT NOT NULL,
    "user"          TEXT,
    pid             INTEGER,
    pid_started_at  REAL,
    node_rank       INTEGER,
    status          TEXT NOT NULL DEFAULT 'running',
    exit_code       INTEGER,
    error           TEXT,
    started_at      REAL NOT NULL,
    ended_at        REAL
);
CREATE INDEX IF NOT EXISTS run_members_run ON run_members(run_id);

-- The requests of a text-generation job (collectors/steps/generation.py): one row per outer
-- call (a `generate()` call, or a hand-written decode loop's run over one prompt), each
-- also one step of the run (``step``). Written when the request starts ('running', so a
-- job killed mid-request leaves it marked) and again when it ends.
CREATE TABLE IF NOT EXISTS requests (
    run_id          INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    rank            INTEGER NOT NULL DEFAULT 0,
    request         INTEGER NOT NULL,       -- 0-based, per rank
    step            INTEGER,                -- the step it is (steps.step); NULL until it ends
    source          TEXT NOT NULL,          -- 'generate' | 'loop'
    status          TEXT NOT NULL,          -- 'running' | 'done' | 'error'
    start_s         REAL NOT NULL,          -- unix seconds: the call (generate) or the prefill
    end_s           REAL,
    rows            INTEGER,                -- sequences generated together (batch rows)
    prompt_tokens   INTEGER,                -- over all rows, padding left out
    new_tokens      INTEGER,                -- over all rows, up to each row's end of sequence
    positions       INTEGER,                -- new tokens of the longest row
    ttft_s          REAL,                   -- start to the first new token
    prefill_s       REAL,                   -- the first forward of the model
    decode_s        REAL,                   -- its other forwards
    forwards        INTEGER,                -- calls of the model
    peak_rss_bytes  REAL,                   -- the process's RSS at its highest during the request
    peak_cuda_bytes REAL,                   -- torch.cuda.max_memory_allocated over the request
    profiled        INTEGER NOT NULL DEFAULT 0,
    tokens          TEXT NOT NULL DEFAULT '[]',  -- JSON [[position, start offset s, seconds], ...]
                                                 -- per forward after the prefill
    meta            TEXT NOT NULL DEFAULT '{}',  -- JSON: settings seen (do_sample, use_cache,
                                                 -- num_beams, the loop's code line, error, ...)
    PRIMARY KEY (run_id, rank, request)
);

-- Names people give runs (`stepscope tag RUN NAME`): a CI job checks against
-- "main-baseline" while the run it names moves on. One run per name; tagging again moves
-- the name, and a run's deletion takes its tags with it.
CREATE TABLE IF NOT EXISTS tags (
    name        TEXT PRIMARY KEY,
    run_id      INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    created_at  REAL NOT NULL,              -- when it was set (or last moved)
    "user"      TEXT,                       -- who set it (a shared store has many)
    host        TEXT NOT NULL
);

-- Which process is which rank of a run (for the distributed view across hosts).
CREATE TABLE IF NOT EXISTS run_ranks (
    run_id      INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    rank        INTEGER NOT NULL,
    host        TEXT NOT NULL,
    pid         INTEGER,
    started_at  REAL NOT NULL,
    PRIMARY KEY (run_id, rank)
);

-- The figures the runs list shows for an ended run (summaries.py), kept so that a list
-- of thousands of runs does not compute them all again. Kept for the run as it was when
-- they were computed (its step count, status and end, and the figures' version); a run
-- that differs from that has them computed again. Data only: shown, never executed.
CREATE TABLE IF NOT EXISTS run_summaries (
    run_id      INTEGER PRIMARY KEY REFERENCES runs(id) ON DELETE CASCADE,
    step_count  INTEGER NOT NULL,
    status      TEXT NOT NULL,
    ended_at    REAL,
    version     INTEGER NOT NULL,           -- how the figures were computed
    figures     TEXT NOT NULL,              -- JSON: {name: number or null}
    created_at  REAL NOT NULL
);

-- What `stepscope show` computes of an ended run (details.py: its step figures, samples,
-- requests, memory breakdown), kept so that `show` answers without computing them again.
-- Kept for the run as it was (``state``: its status and end, how many steps, samples,
-- requests and artifacts it had) and the way they were computed (``version``); a run
-- that differs has them computed again. Data only: shown, never executed.
CREATE TABLE IF NOT EXISTS run_details (
    run_id      INTEGER PRIMARY KEY REFERENCES runs(id) ON DELETE CASCADE,
    state       TEXT NOT NULL,              -- JSON: the run's state they were computed for
    version     INTEGER NOT NULL,           -- how they were computed
    details     TEXT NOT NULL,              -- JSON object
    created_at  REAL NOT NULL
);
"""

# The keys that make a row written twice land once (version 9): the in-job writer
# retries a flush whose commit may have gone through, and its inserts DO NOTHING on
# these. NULLs are distinct in a unique index, hence COALESCE on the nullable columns;
# an event's message is keyed by its first 200 characters (a PostgreSQL index entry
# holds at most about 2.7 kB): two events that differ later would also have to share
# the same rank, source and time to the tenth of a microsecond.
_SAMPLES_KEY = "run_id, t, scope, metric, COALESCE(host, '')"
_EVENTS_KEY = "run_id, t, COALESCE(rank, -1), source, substr(message, 1, 200)"
_ARTIFACTS_KEY = "run_id, rank, kind, path, created_at"  # created_at: stamped when added

# Indexes on columns that a migration adds, or on rows it cleans: created after the
# migrations ran (the DDL runs before them, on a store's rows as they were).
# At most one running run per group: two launchers racing to create it end in one run.
INDEXES = f"""
CREATE UNIQUE INDEX IF NOT EXISTS runs_group_running ON runs(run_group)
    WHERE status = 'running';
CREATE UNIQUE INDEX IF NOT EXISTS samples_key ON samples({_SAMPLES_KEY});
CREATE UNIQUE INDEX IF NOT EXISTS events_key ON events({_EVENTS_KEY});
CREATE UNIQUE INDEX IF NOT EXISTS artifacts_key ON artifacts({_ARTIFACTS_KEY});
"""


def ddl_for(backend: str, sql: str = DDL) -> str:
    """``sql`` with the column types of ``backend``: as written for SQLite; for
    PostgreSQL 64-bit integers, identity keys and double-precision reals."""
    if backend == "sqlite":
        return sql
    sql = sql.replace(
        "INTEGER PRIMARY KEY AUTOINCREMENT", "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"
    )
    sql = re.sub(r"\bINTEGER\b", "BIGINT", sql)
    return re.sub(r"\bREAL\b", "DOUBLE PRECISION", sql)


_FINDINGS_V3_COLUMNS = (
    "run_id, position, class, subtype, title, share, confidence, level, evidence, fixes, created_at"
)


def _rebuilt(table: str, old: str, columns: str) -> str:
    """SQL that recreates ``table`` from the DDL, keeping ``columns`` of its rows.

    For a column added to a table that a store older than the table's first version
    lacks: the DDL (run before the migrations) has just created it complete, where
    ``ALTER TABLE ADD COLUMN`` would fail on the duplicate column; a copy works both
    ways (SQLite has no ADD COLUMN IF NOT EXISTS).
    """
    create = DDL.split(f"CREATE TABLE IF NOT EXISTS {table} (", 1)[1].split(");", 1)[0]
    return (
        f"ALTER TABLE {table} RENAME TO {old};\n"
        f"CREATE TABLE {table} ({create});\n"
        f"INSERT INTO {table}({columns}) SELECT {columns} FROM {old};\n"
        f"DROP TABLE {old};\n"
    )


_STEPS_V6_COLUMNS = (
    "run_id, rank, step, start_s, end_s, data_wait_s, device_s, batch_size, loss, kind,"
    " profiled, forward_s, backward_s, optimizer_s"
)


def _copied(table: str, columns: str, key: tuple[str, str] | None = None) -> str:
    """SQL that rebuilds ``table`` from the DDL (a new primary key), keeping its rows.

    Portable (PostgreSQL stores start at version 5): the copy is created under a new name
    and renamed last, so its key's index never meets the old table's ``{table}_pkey``.
    ``key``: a unique index (name, columns) the copy gets before its rows, which keeps
    one of the rows that share a key (rows written twice) and drops the others; an
    index of that name on the old table goes first (names are per schema, not table).
    """
    create = DDL.split(f"CREATE TABLE IF NOT EXISTS {table} (", 1)[1].split("\n);", 1)[0]
    new = f"{table}_new"
    index, dedupe = "", ""
    if key is not None:
        index = (
            f"DROP INDEX IF EXISTS {key[0]};\nCREATE UNIQUE INDEX {key[0]} ON {new}({key[1]});\n"
        )
        dedupe = " WHERE true ON CONFLICT DO NOTHING"  # WHERE: SQLite's parser needs one
    return (
        f"CREATE TABLE {new} ({create}\n);\n"
        + index
        + f"INSERT INTO {new}({columns}) SELECT {columns} FROM {table}{dedupe};\n"
        f"DROP TABLE {table};\n"
        f"ALTER TABLE {new} RENAME TO {table};\n"
    )


# Version 9 removes the rows an older writer wrote twice before its keys are created.
# An artifact re-inserted by a retried flush got a new created_at: the first row of a
# file with the same kind, rank and meta is kept. Samples and events have no id, so
# their tables are copied through their new key (the portable way to drop duplicates).
_ARTIFACTS_V9 = """
DELETE FROM artifacts WHERE id NOT IN
    (SELECT MIN(id) FROM artifacts GROUP BY run_id, rank, kind, path, meta);
DELETE FROM artifacts WHERE id NOT IN
    (SELECT MIN(id) FROM artifacts GROUP BY run_id, rank, kind, path, created_at);
"""
_SAMPLES_COLUMNS = "run_id, t, scope, metric, value, host"
_EVENTS_COLUMNS = "run_id, t, rank, level, source, message"


# version -> SQL that upgrades from version-1. New tables need no entry (the DDL
# creates them with IF NOT EXISTS); new columns of existing tables do.
MIGRATIONS: dict[int, str] = {
    2: "ALTER TABLE runs ADD COLUMN facts TEXT NOT NULL DEFAULT '{}';",  # + findings table
    3: "",  # the stacks and stack_samples tables
    4: """
ALTER TABLE steps ADD COLUMN forward_s REAL;
ALTER TABLE steps ADD COLUMN backward_s REAL;
ALTER TABLE steps ADD COLUMN optimizer_s REAL;
"""
    + _rebuilt("findings", "findings_v3", _FINDINGS_V3_COLUMNS),
    5: """
ALTER TABLE runs ADD COLUMN "user" TEXT;
ALTER TABLE runs ADD COLUMN run_group TEXT;
ALTER TABLE samples ADD COLUMN host TEXT;
""",  # + the run_members and run_ranks tables
    6: "",  # the requests table (generation jobs)
    7: _copied("steps", _STEPS_V6_COLUMNS),  # the worker column, in the primary key
    8: "",  # the tags table
    9: "ALTER TABLE runs ADD COLUMN signature TEXT;\n"  # + the run_summaries table
    + _ARTIFACTS_V9
    + _copied("samples", _SAMPLES_COLUMNS, ("samples_key", _SAMPLES_KEY))
    + _copied("events", _EVENTS_COLUMNS, ("events_key", _EVENTS_KEY)),
    10: "",  # the run_details table
}
