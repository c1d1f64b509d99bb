-- Tessera schema, version 16: a gang of whole nodes with a remainder share. `gang_remainder`
-- true: `gang_gpus` need not be a multiple of the node size, the last node-share holding the
-- remainder on one node (12 GPUs on 8-GPU nodes: 8 + 4); only a gang (`gang_gpus` set) of whole
-- nodes (`gang_gpus_per_node` NULL) has it. Every workload stored before this version has it
-- false. Portable SQL.
ALTER TABLE workloads ADD COLUMN gang_remainder BOOLEAN NOT NULL DEFAULT FALSE;
