-- Capacity governance: quotas per tenant and resource class (a pool, or pool/MODEL), monthly
-- GPU-unit-hour budgets, and measured utilisation on usage intervals. Portable SQL.

CREATE TABLE quotas (
    tenant           TEXT NOT NULL REFERENCES tenants(name),
    class            TEXT NOT NULL,
    guaranteed_milli BIGINT NOT NULL,
    limit_milli      BIGINT NULL,
    updated_at       BIGINT NOT NULL,
    PRIMARY KEY (tenant, class)
);

CREATE TABLE budgets (
    tenant             TEXT PRIMARY KEY REFERENCES tenants(name),
    monthly_unit_hours DOUBLE PRECISION NOT NULL,
    updated_at         BIGINT NOT NULL
);

-- Average measured GPU utilisation (0..1) over the interval, where telemetry exists.
ALTER TABLE usage_intervals ADD COLUMN util_avg DOUBLE PRECISION NULL;
