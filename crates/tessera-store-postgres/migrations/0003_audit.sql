-- Audit log (as the SQLite store's 0003). Append-only: the application never updates or
-- deletes rows.
CREATE TABLE audit_log (
    seq        BIGINT PRIMARY KEY,
    at         BIGINT NOT NULL,
    request_id TEXT NOT NULL,
    actor      TEXT NOT NULL,
    tenant     TEXT COLLATE "C" NULL,
    action     TEXT NOT NULL,
    target     TEXT NOT NULL,
    outcome    BIGINT NOT NULL,
    detail     TEXT NOT NULL
);
CREATE INDEX audit_tenant ON audit_log (tenant, seq);
