-- Tessera schema, version 13: the priority classes the platform admin granted each tenant, a
-- JSON array of class names; NULL: the default grant (`standard` and `opportunistic`).
-- Portable SQL.

ALTER TABLE tenants ADD COLUMN priorities TEXT;
