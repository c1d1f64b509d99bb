-- Tessera schema, version 17: the workload list in name (and phase) order over every
-- workload, read through an index within a tenant (and across tenants) instead of sorting
-- every row. SQLite compares text byte by byte (BINARY), the order the list promises.
-- Portable SQL.
CREATE INDEX workloads_tenant_name_id ON workloads (tenant, name, id DESC);
CREATE INDEX workloads_name_id ON workloads (name, id DESC);
-- And in phase order, within a tenant and across tenants: the phase index, which also serves
-- the phase filters and the active workloads, newest first within a phase.
CREATE INDEX workloads_tenant_phase_id ON workloads (tenant, phase, id DESC);
DROP INDEX workloads_phase_id;
CREATE INDEX workloads_phase_id ON workloads (phase, id DESC);
