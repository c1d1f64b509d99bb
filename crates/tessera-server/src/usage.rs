//! Usage reports from the ledger: GPU-unit-hours per day, class, project or tenant, on both
//! bases — allocated, and measured use (allocated × measured utilisation) — with cost from a
//! price table per resource class.

use std::collections::{BTreeMap, HashMap};

use tessera_api::{UsageRow, rfc3339_ms};
use tessera_domain::WorkloadId;
use tessera_store::UsageInterval;

/// Price per GPU-unit-hour by resource class (`pool/MODEL` first, then `pool`).
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prices {
    #[serde(default = "default_currency")]
    pub currency: String,
    #[serde(default)]
    pub per_unit_hour: HashMap<String, f64>,
}

impl Default for Prices {
    fn default() -> Self {
        Prices {
            currency: default_currency(),
            per_unit_hour: HashMap::new(),
        }
    }
}

fn default_currency() -> String {
    "EUR".into()
}

impl Prices {
    /// Whether a price list is configured: without one every cost reads 0 and means nothing.
    pub fn configured(&self) -> bool {
        !self.per_unit_hour.is_empty()
    }

    pub fn price(&self, pool: &str, model: &str) -> f64 {
        self.per_unit_hour
            .get(&format!("{pool}/{model}"))
            .or_else(|| self.per_unit_hour.get(pool))
            .copied()
            .unwrap_or(0.0)
    }
}

/// How to group a report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum By {
    Day,
    Class,
    Project,
    Tenant,
}

impl By {
    pub fn as_str(self) -> &'static str {
        match self {
            By::Day => "day",
            By::Class => "class",
            By::Project => "project",
            By::Tenant => "tenant",
        }
    }
}

const HOUR: f64 = 3_600_000.0;
const DAY: i64 = 86_400_000;

/// Sums the intervals clipped to `[from, to)`; open intervals run until `now`. `live_util`
/// gives the utilisation measured so far for open intervals.
pub fn report(
    intervals: &[UsageInterval],
    from: i64,
    to: i64,
    now: i64,
    by: By,
    prices: &Prices,
    live_util: &HashMap<WorkloadId, f64>,
) -> (Vec<UsageRow>, UsageRow) {
    let mut rows: BTreeMap<String, UsageRow> = BTreeMap::new();
    let mut total = UsageRow {
        key: "total".into(),
        allocated_unit_hours: 0.0,
        measured_unit_hours: 0.0,
        cost_allocated: 0.0,
        cost_measured: 0.0,
    };
    for u in intervals {
        let start = u.started_at.max(from);
        let end = u.ended_at.unwrap_or(now).min(to).min(now.max(start));
        if end <= start {
            continue;
        }
        let util = u.util_avg.or_else(|| live_util.get(&u.workload).copied());
        let price = prices.price(&u.pool, &u.model);
        let units = u.units.as_f64();
        // Split by day when grouping by day; otherwise one piece.
        let mut pieces = Vec::new();
        if by == By::Day {
            let mut s = start;
            while s < end {
                let day_end = (s.div_euclid(DAY) + 1) * DAY;
                let e = end.min(day_end);
                pieces.push((rfc3339_ms(s)[..10].to_string(), s, e));
                s = e;
            }
        } else {
            let key = match by {
                By::Class => format!("{}/{}", u.pool, u.model),
                By::Project => format!("{}/{}", u.tenant, u.project),
                By::Tenant => u.tenant.clone(),
                By::Day => unreachable!(),
            };
            pieces.push((key, start, end));
        }
        for (key, s, e) in pieces {
            let alloc = units * (e - s) as f64 / HOUR;
            let measured = alloc * util.unwrap_or(0.0);
            let r = rows.entry(key.clone()).or_insert_with(|| UsageRow {
                key,
                allocated_unit_hours: 0.0,
                measured_unit_hours: 0.0,
                cost_allocated: 0.0,
                cost_measured: 0.0,
            });
            for t in [&mut *r, &mut total] {
                t.allocated_unit_hours += alloc;
                t.measured_unit_hours += measured;
                t.cost_allocated += alloc * price;
                t.cost_measured += measured * price;
            }
        }
    }
    (rows.into_values().collect(), total)
}

/// The report as CSV (header, one line per row, then the total).
pub fn csv(by: By, currency: &str, rows: &[UsageRow], total: &UsageRow) -> String {
    let key = by.as_str();
    let mut out =
        format!("{key},allocated_unit_hours,measured_unit_hours,cost_allocated_{currency},cost_measured_{currency}\n");
    for r in rows.iter().chain(std::iter::once(total)) {
        let k = if r.key.contains(',') || r.key.contains('"') {
            format!("\"{}\"", r.key.replace('"', "\"\""))
        } else {
            r.key.clone()
        };
        out.push_str(&format!(
            "{k},{:.6},{:.6},{:.2},{:.2}\n",
            r.allocated_unit_hours, r.measured_unit_hours, r.cost_allocated, r.cost_measured
        ));
    }
    out
}

/// Midnight UTC of a `YYYY-MM-DD` (tests).
pub fn day(y: i16, m: i8, d: i8) -> i64 {
    jiff::tz::Offset::UTC
        .to_timestamp(jiff::civil::date(y, m, d).to_datetime(jiff::civil::Time::midnight()))
        .expect("a date of the tests")
        .as_millisecond()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(id: u64, project: &str, units: u64, s: i64, e: Option<i64>, util: Option<f64>) -> UsageInterval {
        UsageInterval {
            workload: WorkloadId(id),
            seq: 0,
            tenant: "vision".into(),
            project: project.into(),
            pool: "serving".into(),
            model: "A100-80GB".into(),
            shape: "x".into(),
            units: tessera_model::GpuUnits(units),
            started_at: s,
            ended_at: e,
            util_avg: util,
        }
    }

    #[test]
    fn splits_by_day_clips_and_prices() {
        let d = day(2026, 11, 28);
        let h = 3_600_000;
        // 0.5 units from 22:00 on the 28th to 02:00 on the 29th at 50 % utilisation.
        let ivs = vec![
            iv(1, "a", 500, d + 22 * h, Some(d + 26 * h), Some(0.5)),
            iv(2, "b", 1000, d, None, None),
        ];
        let prices = Prices {
            currency: "EUR".into(),
            per_unit_hour: HashMap::from([("serving".to_string(), 2.0)]),
        };
        // Two days from the 28th, now 02:00 on the 29th.
        let report_by = |by: By, utilisation: &HashMap<WorkloadId, f64>| {
            report(&ivs, d, d + 2 * 24 * h, d + 26 * h, by, &prices, utilisation)
        };
        let (rows, total) = report_by(By::Day, &HashMap::from([(WorkloadId(2), 0.25)]));
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].key, "2026-11-28");
        // day 1: #1 2 h × 0.5 = 1.0; #2 24 h × 1 = 24 → 25
        assert!((rows[0].allocated_unit_hours - 25.0).abs() < 1e-9);
        // day 2: #1 2 h × 0.5 = 1.0; #2 runs until now (02:00) = 2 → 3
        assert!((rows[1].allocated_unit_hours - 3.0).abs() < 1e-9);
        assert!((total.allocated_unit_hours - 28.0).abs() < 1e-9);
        assert!((total.measured_unit_hours - (2.0 * 0.5 + 26.0 * 0.25)).abs() < 1e-9);
        assert!((total.cost_allocated - 56.0).abs() < 1e-9);
        let (rows, _) = report_by(By::Project, &HashMap::new());
        assert_eq!(
            rows.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(),
            ["vision/a", "vision/b"]
        );
        let c = csv(By::Project, "EUR", &rows, &total);
        assert!(c.starts_with("project,allocated_unit_hours,measured_unit_hours,cost_allocated_EUR,cost_measured_EUR\nvision/a,2.000000"), "{c}");
    }
}
