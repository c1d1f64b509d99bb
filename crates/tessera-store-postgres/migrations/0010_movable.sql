-- Tessera schema, version 10 (as the SQLite store's 0010): whether and how consolidation may
-- move a running workload (`restart`: batch work stopped and requeued; `replace`: a service
-- whose replacement starts first); NULL: never. Workloads stored before this version are not
-- movable.

ALTER TABLE workloads ADD COLUMN movable TEXT NULL;
