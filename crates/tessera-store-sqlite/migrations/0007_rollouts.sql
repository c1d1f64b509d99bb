-- Rolling upgrades and what a drain needs to resume after a restart. Portable SQL (SQLite >=
-- 3.35 and PostgreSQL). Times are milliseconds since the Unix epoch, UTC.
--
-- * gpu_health.cause: why a GPU is out (xid, lost, partition-failed), so that a node coming
--   back clears only the GPUs it lost;
-- * drains: the deadline and `after` policy of each drain in progress;
-- * service_moves: old service -> its replacement, so that a restart mid-move does not start a
--   second replacement;
-- * rollouts and rollout_nodes: each rolling upgrade and the state of each of its nodes; ids
--   come from the `rollout` sequence.

ALTER TABLE gpu_health ADD COLUMN cause TEXT NOT NULL DEFAULT 'xid';
UPDATE gpu_health SET cause = 'lost' WHERE xid IS NULL;

CREATE TABLE drains (
    node        TEXT PRIMARY KEY,
    deadline_ms BIGINT NULL,
    preempt     BOOLEAN NOT NULL
);

CREATE TABLE service_moves (
    old_id         BIGINT PRIMARY KEY,
    replacement_id BIGINT NOT NULL,
    node           TEXT NOT NULL
);

INSERT INTO sequences (name, value) VALUES ('rollout', 0);

CREATE TABLE rollouts (
    id                    BIGINT PRIMARY KEY,
    pool                  TEXT NOT NULL,
    max_parallel          BIGINT NOT NULL,
    max_unavailable_milli BIGINT NOT NULL,
    deadline_s            BIGINT NULL,
    preempt               BOOLEAN NOT NULL,
    upgrade_s             BIGINT NULL,
    state                 TEXT NOT NULL,
    created_at            BIGINT NOT NULL,
    created_by            TEXT NOT NULL,
    ended_at              BIGINT NULL,
    detail                TEXT NOT NULL
);

CREATE TABLE rollout_nodes (
    rollout_id    BIGINT NOT NULL REFERENCES rollouts (id),
    position      BIGINT NOT NULL,
    node          TEXT NOT NULL,
    state         TEXT NOT NULL,
    since         BIGINT NOT NULL,
    started_at    BIGINT NULL,
    ended_at      BIGINT NULL,
    upgrade_until BIGINT NULL,
    layout        TEXT NOT NULL,
    detail        TEXT NOT NULL,
    PRIMARY KEY (rollout_id, position)
);
