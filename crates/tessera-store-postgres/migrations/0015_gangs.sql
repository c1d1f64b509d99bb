-- Tessera schema, version 15 (as the SQLite store's 0015, every integer BIGINT): multi-node
-- gangs. A gang's shape is in the `gang_` columns (`gang_gpus` set: the workload asked for a
-- gang, and `gpus`, `mig_profile` and `fraction_milli` stay NULL); a placed gang's
-- node-shares after the first (which is in the `p_` columns) are in `p_shares`. Workloads
-- stored before this version are no gangs and hold one node-share at most.

-- The gang as asked for: GPUs in all; GPUs per node-share (NULL: whole nodes); a topology
-- level (`rack`, `block`, a label key or `pool`) and mode (`required` | `preferred`), both
-- set or both NULL; the size of the groups kept within one rack (NULL: none).
ALTER TABLE workloads ADD COLUMN gang_gpus BIGINT NULL;
ALTER TABLE workloads ADD COLUMN gang_gpus_per_node BIGINT NULL;
ALTER TABLE workloads ADD COLUMN gang_topology_level TEXT NULL;
ALTER TABLE workloads ADD COLUMN gang_topology_mode TEXT NULL;
ALTER TABLE workloads ADD COLUMN gang_segment BIGINT NULL;
-- A JSON array, in gang order, of the node-shares after the first, each
-- `{"pool", "node", "model", "gpus": [GPU indexes], "units_milli"}` (whole GPUs); NULL: none.
ALTER TABLE workloads ADD COLUMN p_shares TEXT NULL;
