-- Tessera schema, version 16: the workload list in name order over every workload, read
-- through an index within a tenant (and across tenants) instead of sorting every row. SQLite
-- compares text byte by byte (BINARY), the order the list promises. Portable SQL.
CREATE INDEX workloads_tenant_name_id ON workloads (tenant, name, id DESC);
CREATE INDEX workloads_name_id ON workloads (name, id DESC);
