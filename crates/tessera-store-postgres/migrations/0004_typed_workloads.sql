-- Tessera schema, version 4, for PostgreSQL: workloads in typed columns, reason codes on
-- timeline events, and the database's own sequences for workload ids and audit sequence
-- numbers (as the SQLite store's 0004, every integer BIGINT). Times are milliseconds since the
-- Unix epoch, UTC.
--
-- The version-1 table is kept as `workloads_v1` so that both schemas have the same shape; no
-- PostgreSQL database ever held version-1 rows, so it stays empty.

ALTER TABLE workloads RENAME TO workloads_v1;

CREATE TABLE workloads (
    id                  BIGINT PRIMARY KEY,
    -- What it asked for (immutable once inserted).
    tenant              TEXT COLLATE "C" NOT NULL,
    project             TEXT COLLATE "C" NOT NULL,
    name                TEXT NOT NULL,
    kind                TEXT NOT NULL,        -- batch | service | interactive
    -- The GPU shape: exactly one of gpus, mig_profile, fraction_milli is set.
    gpus                BIGINT  NULL,
    mig_profile         TEXT NULL,
    fraction_milli      BIGINT  NULL,
    fraction_memory_mib BIGINT NULL,
    shape_models        TEXT NOT NULL,        -- JSON array of strings
    shape_pool          TEXT NULL,
    cpu_milli           BIGINT NOT NULL,
    memory_mib          BIGINT NOT NULL,
    duration_s          BIGINT NULL,
    command             TEXT NULL,            -- JSON array of strings
    image               TEXT NULL,
    env                 TEXT NOT NULL,        -- JSON object of strings
    priority            TEXT NOT NULL,
    no_wait             BOOLEAN NOT NULL,
    no_requeue          BOOLEAN NOT NULL,
    units_milli         BIGINT NOT NULL,
    created_at          BIGINT NOT NULL,
    -- Its lifecycle.
    phase               TEXT NOT NULL,
    reason_code         TEXT NULL,            -- both reason columns are set, or neither
    reason_detail       TEXT NULL,
    borrowing           BOOLEAN NOT NULL,
    running_at          BIGINT NULL,
    ended_at            BIGINT NULL,
    updated_at          BIGINT NOT NULL,
    stop_kind           TEXT NULL,            -- cancel | priority | reclaim
    stop_by             TEXT NULL,            -- who cancelled it, or the preempting workload's id
    stop_detail         TEXT NULL,            -- the preemption's sentence
    next_event_seq      BIGINT NOT NULL,
    usage_seq           BIGINT NOT NULL,
    usage_open          BOOLEAN NOT NULL,
    -- Its placement: all NULL without one.
    p_pool              TEXT NULL,
    p_node              TEXT NULL,
    p_model             TEXT NULL,
    p_gpus              BIGINT NULL,          -- bit i set: GPU i of the node
    p_slice             TEXT NULL,            -- whole | mig | fraction | cpu
    p_mig_profile       TEXT NULL,
    p_mig_profile_id    BIGINT NULL,
    p_mig_start         BIGINT  NULL,
    p_mig_size          BIGINT  NULL,
    p_fraction_milli    BIGINT  NULL,
    p_gpu_memory_mib    BIGINT NULL,
    p_units_milli       BIGINT NULL
);
-- Listing within a tenant scope (and project), newest first.
CREATE INDEX workloads_tenant_id ON workloads (tenant, id);
CREATE INDEX workloads_tenant_project_id ON workloads (tenant, project, id);
-- The active workloads (start-up and failover) and phase filters.
CREATE INDEX workloads_phase_id ON workloads (phase, id);

-- The reason code of queued, failed, cancelled and preempted steps.
ALTER TABLE workload_events ADD COLUMN code TEXT NULL;

-- Counters the database hands out: `workload` is the last workload id reserved, `audit` the
-- last audit sequence number assigned.
CREATE TABLE sequences (
    name  TEXT PRIMARY KEY,
    value BIGINT NOT NULL
);
INSERT INTO sequences (name, value) SELECT 'workload', COALESCE(MAX(id), 0) FROM workloads_v1;
INSERT INTO sequences (name, value) SELECT 'audit', COALESCE(MAX(seq), 0) FROM audit_log;
