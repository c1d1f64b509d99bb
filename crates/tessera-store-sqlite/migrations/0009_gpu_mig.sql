-- MIG mode an admin set on a GPU (`tessera node mig enable|disable`), so that a restart keeps
-- it: `enabled` is the mode asked for; `pending` when the driver applies it only after a GPU
-- reset (which Tessera never performs). A GPU without a row has its pool's mode. Portable SQL.

CREATE TABLE gpu_mig_modes (
    node    TEXT NOT NULL,
    gpu     INTEGER NOT NULL,
    enabled BOOLEAN NOT NULL,
    pending BOOLEAN NOT NULL,
    since   BIGINT NOT NULL,
    detail  TEXT NOT NULL,
    PRIMARY KEY (node, gpu)
);
