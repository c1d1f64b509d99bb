-- Tessera schema, version 6: the leader lease of replicas sharing a database and their
-- heartbeats. Times are milliseconds since the Unix epoch by the database's clock.

-- One row: who holds the lease, the URL followers forward writes to, an epoch that grows with
-- every acquisition (the fence of the holder's batches), and when it expires.
CREATE TABLE leader (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    holder      TEXT NULL,
    url         TEXT NOT NULL,
    epoch       BIGINT NOT NULL,
    acquired_at BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL
);
INSERT INTO leader (id, holder, url, epoch, acquired_at, expires_at) VALUES (1, NULL, '', 0, 0, 0);

-- One row per replica: its last heartbeat.
CREATE TABLE replicas (
    id         TEXT PRIMARY KEY,
    url        TEXT NOT NULL,
    version    TEXT NOT NULL,
    started_at BIGINT NOT NULL,
    last_seen  BIGINT NOT NULL
);
