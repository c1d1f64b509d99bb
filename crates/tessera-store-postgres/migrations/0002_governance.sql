-- Capacity governance: quotas per tenant and resource class, monthly budgets, measured
-- utilisation on usage intervals (as the SQLite store's 0002).

CREATE TABLE quotas (
    tenant           TEXT COLLATE "C" NOT NULL REFERENCES tenants(name),
    class            TEXT COLLATE "C" NOT NULL,
    guaranteed_milli BIGINT NOT NULL,
    limit_milli      BIGINT NULL,
    updated_at       BIGINT NOT NULL,
    PRIMARY KEY (tenant, class)
);

CREATE TABLE budgets (
    tenant             TEXT COLLATE "C" PRIMARY KEY REFERENCES tenants(name),
    monthly_unit_hours DOUBLE PRECISION NOT NULL,
    updated_at         BIGINT NOT NULL
);

ALTER TABLE usage_intervals ADD COLUMN util_avg DOUBLE PRECISION NULL;
