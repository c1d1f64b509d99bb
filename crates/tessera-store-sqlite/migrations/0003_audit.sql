-- Audit log: every mutating request, login, authentication failure and permission denial.
-- Append-only: the application never updates or deletes rows.
CREATE TABLE audit_log (
    seq        BIGINT PRIMARY KEY,
    at         BIGINT NOT NULL,
    request_id TEXT NOT NULL,
    actor      TEXT NOT NULL,
    tenant     TEXT NULL,
    action     TEXT NOT NULL,
    target     TEXT NOT NULL,
    outcome    INTEGER NOT NULL,
    detail     TEXT NOT NULL
);
CREATE INDEX audit_tenant ON audit_log (tenant, seq);
