-- Fleet operations: GPUs taken out of placement because they failed (until a platform admin
-- clears them) and nodes an operator took out of placement (cordoned, draining, maintenance;
-- a node without a row is ready). Portable SQL.

CREATE TABLE gpu_health (
    node   TEXT NOT NULL,
    gpu    INTEGER NOT NULL,
    since  BIGINT NOT NULL,
    xid    BIGINT NULL,
    detail TEXT NOT NULL,
    PRIMARY KEY (node, gpu)
);

CREATE TABLE node_states (
    node   TEXT PRIMARY KEY,
    state  TEXT NOT NULL,
    since  BIGINT NOT NULL,
    detail TEXT NOT NULL
);
