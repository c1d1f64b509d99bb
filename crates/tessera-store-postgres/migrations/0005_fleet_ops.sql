-- Tessera schema, version 5 (as the SQLite store's 0005): fleet operations. GPUs taken out of
-- placement because they failed (until a platform admin clears them) and nodes an operator took
-- out of placement (cordoned, draining, maintenance; a node without a row is ready). Times are
-- milliseconds since the Unix epoch.

CREATE TABLE gpu_health (
    node   TEXT COLLATE "C" NOT NULL,
    gpu    BIGINT NOT NULL,
    since  BIGINT NOT NULL,
    xid    BIGINT NULL,
    detail TEXT NOT NULL,
    PRIMARY KEY (node, gpu)
);

CREATE TABLE node_states (
    node   TEXT COLLATE "C" PRIMARY KEY,
    state  TEXT NOT NULL,
    since  BIGINT NOT NULL,
    detail TEXT NOT NULL
);
