-- Tessera schema, version 8: each tenant's image policy. `registries` and `cosign_keys` are JSON
-- arrays of strings (allowed registry/repository prefixes; PEM public keys). Portable SQL.

CREATE TABLE image_policies (
    tenant      TEXT COLLATE "C" PRIMARY KEY REFERENCES tenants(name),
    registries  TEXT NOT NULL,
    cosign_keys TEXT NOT NULL,
    updated_at  BIGINT NOT NULL
);
