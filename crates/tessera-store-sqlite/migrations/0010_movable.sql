-- Whether and how consolidation may move a running workload (`restart`: batch work stopped
-- and requeued; `replace`: a service whose replacement starts first); NULL: never. Workloads
-- stored before this version are not movable. Portable SQL.

ALTER TABLE workloads ADD COLUMN movable TEXT NULL;
