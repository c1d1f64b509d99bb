-- Tessera schema, version 18 (as the SQLite store's 0018): the console's telemetry history, so
-- that its charts survive a restart and a failover. One row per series (`pool:NAME`,
-- `workload:ID`), span (1: a minute; 60: an hour of a workload's minutes older than a day,
-- folded together) and start (ms since the epoch). The figures are sums over the `minutes` the
-- row takes together (a minute's are its own figures); NULL where not reported. The key is
-- time first: reads since a time, the hourly fold and the prune of what is older than 30 days
-- scan a range of it, and no other index is kept.
CREATE TABLE telemetry_samples (
    at BIGINT NOT NULL,
    series TEXT COLLATE "C" NOT NULL,
    span_minutes BIGINT NOT NULL,
    minutes BIGINT NOT NULL,
    util_sum DOUBLE PRECISION NULL,
    used_mib_sum DOUBLE PRECISION NULL,
    total_mib BIGINT NULL,
    PRIMARY KEY (at, series, span_minutes)
);
