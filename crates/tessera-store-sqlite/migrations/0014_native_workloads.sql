-- Tessera schema, version 14: a workload asked for with the backend's own tools (a pod made
-- with kubectl and admitted through Tessera's webhook) names the backend's object it is
-- (`namespace/name/uid`); NULL: Tessera makes what runs it.
-- Portable SQL.

ALTER TABLE workloads ADD COLUMN native TEXT;
