-- Service moves record why they happen (`drain`: the node is drained; `consolidation`: a
-- request waiting for fragmented capacity fits once the service moves) and, for
-- consolidation, the request they make room for; so a restart mid-move continues the move
-- (the replacement is not started twice, the original stops once it runs). Moves stored
-- before this version were drains. Portable SQL.

ALTER TABLE service_moves ADD COLUMN cause TEXT NOT NULL DEFAULT 'drain';
ALTER TABLE service_moves ADD COLUMN by_id BIGINT NULL;
