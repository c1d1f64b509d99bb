-- Tessera schema, version 1, for PostgreSQL: the tables of the SQLite store's 0001 with
-- PostgreSQL's types (every integer BIGINT, ordered keys COLLATE "C"; see the crate doc).
-- Times are milliseconds since the Unix epoch, UTC.

CREATE TABLE tenants (
    name         TEXT COLLATE "C" PRIMARY KEY,
    display_name TEXT NOT NULL,
    created_at   BIGINT NOT NULL
);

CREATE TABLE projects (
    tenant     TEXT COLLATE "C" NOT NULL REFERENCES tenants(name),
    name       TEXT COLLATE "C" NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (tenant, name)
);

-- API tokens: only a SHA-256 hash of the secret is stored.
CREATE TABLE api_tokens (
    id         TEXT COLLATE "C" PRIMARY KEY,
    hash       TEXT NOT NULL UNIQUE,
    tenant     TEXT COLLATE "C" NULL REFERENCES tenants(name),
    role       TEXT NOT NULL,
    name       TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NULL,
    revoked_at BIGINT NULL
);

-- Version 1 kept one JSON document per workload (replaced by typed columns in version 4).
CREATE TABLE workloads (
    id         BIGINT PRIMARY KEY,
    tenant     TEXT COLLATE "C" NOT NULL,
    project    TEXT COLLATE "C" NOT NULL,
    state      TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    doc        TEXT NOT NULL
);
CREATE INDEX workloads_tenant ON workloads (tenant, project, id);
CREATE INDEX workloads_state ON workloads (state, id);

-- The timeline of each workload.
CREATE TABLE workload_events (
    workload_id BIGINT NOT NULL,
    seq         BIGINT NOT NULL,
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

-- Usage ledger: one row per allocation interval.
CREATE TABLE usage_intervals (
    workload_id BIGINT NOT NULL,
    seq         BIGINT NOT NULL,
    tenant      TEXT COLLATE "C" NOT NULL,
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
