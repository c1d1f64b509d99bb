-- Tessera schema, version 1. Portable SQL: it runs unchanged on SQLite and PostgreSQL
-- (TEXT, BIGINT, no AUTOINCREMENT, no engine-specific types). Times are milliseconds since
-- the Unix epoch, UTC.

CREATE TABLE tenants (
    name         TEXT PRIMARY KEY,
    display_name TEXT NOT NULL,
    created_at   BIGINT NOT NULL
);

CREATE TABLE projects (
    tenant     TEXT NOT NULL REFERENCES tenants(name),
    name       TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (tenant, name)
);

-- API tokens: only a SHA-256 hash of the secret is stored.
CREATE TABLE api_tokens (
    id         TEXT PRIMARY KEY,
    hash       TEXT NOT NULL UNIQUE,
    tenant     TEXT NULL REFERENCES tenants(name),
    role       TEXT NOT NULL,
    name       TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NULL,
    revoked_at BIGINT NULL
);

-- One row per workload; `doc` is the API representation (JSON), the other columns index it.
CREATE TABLE workloads (
    id         BIGINT PRIMARY KEY,
    tenant     TEXT NOT NULL,
    project    TEXT NOT NULL,
    state      TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    doc        TEXT NOT NULL
);
CREATE INDEX workloads_tenant ON workloads (tenant, project, id);
CREATE INDEX workloads_state ON workloads (state, id);

-- The timeline of each workload: requested, authorised, placed, partitioned, running,
-- observed, metered, released, plus queued/failed/cancelled/preempted.
CREATE TABLE workload_events (
    workload_id BIGINT NOT NULL,
    seq         INTEGER NOT NULL,
    step        TEXT NOT NULL,
    at          BIGINT NOT NULL,
    detail      TEXT NOT NULL,
    PRIMARY KEY (workload_id, seq)
);

-- Idempotency-Key of workload creations, per actor.
CREATE TABLE idempotency_keys (
    actor        TEXT NOT NULL,
    key          TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    workload_id  BIGINT NOT NULL,
    created_at   BIGINT NOT NULL,
    PRIMARY KEY (actor, key)
);

-- Usage ledger: one row per allocation interval, opened when a workload starts running and
-- closed when it releases its capacity, in the same transactions as those changes.
CREATE TABLE usage_intervals (
    workload_id BIGINT NOT NULL,
    seq         INTEGER NOT NULL,
    tenant      TEXT NOT NULL,
    project     TEXT NOT NULL,
    pool        TEXT NOT NULL,
    model       TEXT NOT NULL,
    shape       TEXT NOT NULL,
    units_milli BIGINT NOT NULL,
    started_at  BIGINT NOT NULL,
    ended_at    BIGINT NULL,
    PRIMARY KEY (workload_id, seq)
);
CREATE INDEX usage_tenant ON usage_intervals (tenant, started_at);
