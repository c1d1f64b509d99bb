-- Budgets are checked against the month's closed usage, summed per tenant by the database
-- (`closed_usage`): this index finds the intervals that ended since the month began without
-- reading the rest of the ledger, so a start-up reads a month, not the ledger's history.
-- Portable SQL.

CREATE INDEX usage_ended ON usage_intervals (ended_at);
