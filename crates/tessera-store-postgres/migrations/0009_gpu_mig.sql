-- Tessera schema, version 8 (as the SQLite store's 0008): MIG mode an admin set on a GPU
-- (`tessera node mig enable|disable`), so that a restart keeps it: `enabled` is the mode asked
-- for; `pending` when the driver applies it only after a GPU reset (which Tessera never
-- performs). A GPU without a row has its pool's mode.

CREATE TABLE gpu_mig_modes (
    node    TEXT COLLATE "C" NOT NULL,
    gpu     BIGINT NOT NULL,
    enabled BOOLEAN NOT NULL,
    pending BOOLEAN NOT NULL,
    since   BIGINT NOT NULL,
    detail  TEXT NOT NULL,
    PRIMARY KEY (node, gpu)
);
