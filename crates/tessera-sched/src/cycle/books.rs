//! The cycle's books: quotas per tenant and resource class, monthly budgets and what has been
//! spent, the units each tenant holds per class, and its decayed usage, from which fair share
//! is computed. Everything here is bookkeeping; what to do about a limit is the actions' call.

use std::collections::{BTreeMap, HashMap};

use tessera_model::GpuUnits;

use crate::reason::{BudgetExceeded, LimitExceeded, LimitScope};

/// A tenant's share of one resource class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quota {
    /// Always available to the tenant, reclaimable from borrowers.
    pub guaranteed: GpuUnits,
    /// The most it may hold, borrowing included; `None` = no limit.
    pub limit: Option<GpuUnits>,
}

/// How a request within every limit is admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Within the tenant's guaranteed share: never reclaimed.
    WithinGuarantee,
    /// Above it (or the tenant has no quota at all): reclaimable by tenants within theirs.
    Borrowing,
}

impl Admission {
    pub fn borrowing(self) -> bool {
        self == Admission::Borrowing
    }
}

/// The quota key of a project's sub-quota within its tenant (across all pools).
pub fn project_key(project: &str) -> String {
    format!("{PROJECT_PREFIX}{project}")
}

const PROJECT_PREFIX: &str = "project:";

#[derive(Clone, Debug, Default)]
struct TenantBook {
    held: HashMap<String, GpuUnits>,
    /// Decayed usage in unit-milliseconds, and when it was last brought up to date.
    usage: f64,
    usage_at: i64,
    held_total: GpuUnits,
}

/// Quotas, budgets and holdings of every tenant.
#[derive(Debug, Default)]
pub(super) struct Books {
    /// Per tenant, its quota per class.
    quotas: HashMap<String, BTreeMap<String, Quota>>,
    /// Monthly GPU-unit-hour budgets and what has been spent this month.
    budgets: HashMap<String, f64>,
    spent: HashMap<String, f64>,
    tenants: HashMap<String, TenantBook>,
}

impl Books {
    pub fn set_quota(&mut self, tenant: &str, class: &str, q: Option<Quota>) {
        match q {
            Some(q) => {
                self.quotas
                    .entry(tenant.to_string())
                    .or_default()
                    .insert(class.to_string(), q);
            }
            None => {
                if let Some(m) = self.quotas.get_mut(tenant) {
                    m.remove(class);
                    if m.is_empty() {
                        self.quotas.remove(tenant);
                    }
                }
            }
        }
    }

    pub fn quota(&self, tenant: &str, class: &str) -> Option<Quota> {
        self.quotas.get(tenant)?.get(class).copied()
    }

    /// Every quota of a tenant, by class name.
    pub fn quotas_of(&self, tenant: &str) -> Vec<(String, Quota)> {
        self.quotas
            .get(tenant)
            .map(|m| m.iter().map(|(c, q)| (c.clone(), *q)).collect())
            .unwrap_or_default()
    }

    /// Every quota: (tenant, resource class, quota).
    pub fn all_quotas(&self) -> impl Iterator<Item = (&String, &String, Quota)> {
        self.quotas
            .iter()
            .flat_map(|(t, m)| m.iter().map(move |(c, q)| (t, c, *q)))
    }

    /// Every budget: (tenant, GPU-unit-hours per month).
    pub fn all_budgets(&self) -> impl Iterator<Item = (&String, f64)> {
        self.budgets.iter().map(|(t, b)| (t, *b))
    }

    pub fn set_budget(&mut self, tenant: &str, unit_hours: Option<f64>) {
        match unit_hours {
            Some(b) => self.budgets.insert(tenant.to_string(), b),
            None => self.budgets.remove(tenant),
        };
    }

    pub fn budget(&self, tenant: &str) -> Option<f64> {
        self.budgets.get(tenant).copied()
    }

    pub fn set_spent(&mut self, tenant: &str, unit_hours: f64) {
        self.spent.insert(tenant.to_string(), unit_hours);
    }

    pub fn spent(&self, tenant: &str) -> f64 {
        self.spent.get(tenant).copied().unwrap_or(0.0)
    }

    /// The tenant's spent budget, if it has one and has spent it.
    pub fn budget_exceeded(&self, tenant: &str) -> Option<BudgetExceeded> {
        let budget = self.budget(tenant)?;
        let spent = self.spent(tenant);
        (spent >= budget).then(|| BudgetExceeded {
            tenant: tenant.to_string(),
            spent,
            budget,
        })
    }

    /// Units a tenant holds in a class.
    pub fn held(&self, tenant: &str, class: &str) -> GpuUnits {
        self.tenants
            .get(tenant)
            .and_then(|b| b.held.get(class))
            .copied()
            .unwrap_or_default()
    }

    /// Brings a tenant's decayed usage up to `now`.
    pub fn decay(&mut self, tenant: &str, now: i64, half_life_ms: i64) {
        self.book(tenant, now, half_life_ms);
    }

    fn book(&mut self, tenant: &str, now: i64, half_life_ms: i64) -> &mut TenantBook {
        let half = half_life_ms.max(1) as f64;
        let b = self.tenants.entry(tenant.to_string()).or_default();
        if now > b.usage_at {
            let dt = (now - b.usage_at) as f64;
            b.usage = b.usage * (0.5f64).powf(dt / half) + b.held_total.as_f64() * dt;
            b.usage_at = now;
        }
        b
    }

    /// Books `units` more (`add`) or fewer in every class of `keys`, decaying usage first so
    /// that the change counts only from `now`.
    pub fn account(&mut self, tenant: &str, keys: &[String], units: GpuUnits, add: bool, now: i64, half_life_ms: i64) {
        let b = self.book(tenant, now, half_life_ms);
        for k in keys {
            let h = b.held.entry(k.clone()).or_default();
            if add {
                *h += units;
            } else {
                *h -= units;
            }
        }
        if add {
            b.held_total += units;
        } else {
            b.held_total -= units;
        }
    }

    fn guaranteed_total(&self, tenant: &str) -> f64 {
        self.quotas.get(tenant).map_or(0.0, |m| {
            m.iter()
                .filter(|(c, _)| !c.contains('/'))
                .map(|(_, q)| q.guaranteed.as_f64())
                .sum()
        })
    }

    /// Fair-share key: decayed usage relative to the guaranteed share (lower goes first).
    pub fn fair_share(&self, tenant: &str) -> f64 {
        let usage = self.tenants.get(tenant).map(|b| b.usage).unwrap_or(0.0);
        usage / self.guaranteed_total(tenant).max(1.0)
    }

    /// Checks the tenant's quotas for `units` more in every class of `keys`.
    pub fn check<K: AsRef<str>>(&self, tenant: &str, keys: &[K], units: GpuUnits) -> Result<Admission, LimitExceeded> {
        // Every queued job is checked every cycle: look the tenant up once.
        let Some(quotas) = self.quotas.get(tenant) else {
            return Ok(Admission::Borrowing);
        };
        let book = self.tenants.get(tenant);
        check_quotas(
            tenant,
            keys,
            units,
            |k| quotas.get(k).copied(),
            |k| book.and_then(|b| b.held.get(k)).copied().unwrap_or_default(),
        )
    }
}

/// The quota check of `units` more for `tenant` in every class of `keys`, on any holder of
/// quotas and holdings: the cycle's books, or a published snapshot of them (the API's dry run).
/// `Err` with the figures when a limit would be passed; otherwise whether the units borrow
/// (above the guarantee, or no quota at all).
pub fn check_quotas<K: AsRef<str>>(
    tenant: &str,
    keys: &[K],
    units: GpuUnits,
    quota: impl Fn(&str) -> Option<Quota>,
    held_in: impl Fn(&str) -> GpuUnits,
) -> Result<Admission, LimitExceeded> {
    let mut borrowing = true;
    let mut any = false;
    for k in keys {
        let k = k.as_ref();
        let Some(q) = quota(k) else { continue };
        any = true;
        let held = held_in(k);
        if let Some(limit) = q.limit
            && held + units > limit
        {
            let scope = match k.strip_prefix(PROJECT_PREFIX) {
                Some(project) => LimitScope::Project {
                    project: project.to_string(),
                },
                None => LimitScope::Class {
                    class: k.to_string(),
                    guaranteed: q.guaranteed,
                },
            };
            return Err(LimitExceeded {
                tenant: tenant.to_string(),
                scope,
                held,
                limit,
                needs: units,
            });
        }
        // Project sub-quotas cap a project; the tenant's pool and model guarantees decide
        // whether it borrows.
        if !k.starts_with(PROJECT_PREFIX) {
            borrowing = held + units > q.guaranteed;
        }
    }
    Ok(if !any || borrowing {
        Admission::Borrowing
    } else {
        Admission::WithinGuarantee
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(guaranteed: u64, limit: Option<u64>) -> Option<Quota> {
        Some(Quota {
            guaranteed: GpuUnits::whole(guaranteed),
            limit: limit.map(GpuUnits::whole),
        })
    }

    #[test]
    fn a_tenant_borrows_above_its_guarantee_and_stops_at_its_limit() {
        let mut b = Books::default();
        let keys = vec!["training".to_string(), project_key("p")];
        assert_eq!(
            b.check("a", &keys, GpuUnits::whole(1)),
            Ok(Admission::Borrowing),
            "no quota at all: everything is borrowed"
        );
        b.set_quota("a", "training", quota(8, Some(10)));
        assert_eq!(b.check("a", &keys, GpuUnits::whole(8)), Ok(Admission::WithinGuarantee));
        b.account("a", &keys, GpuUnits::whole(8), true, 0, 1000);
        assert_eq!(b.held("a", "training"), GpuUnits::whole(8));
        assert_eq!(b.check("a", &keys, GpuUnits::whole(2)), Ok(Admission::Borrowing));
        let over = b.check("a", &keys, GpuUnits::whole(3)).unwrap_err();
        assert_eq!(
            (over.held, over.limit, over.needs),
            (GpuUnits::whole(8), GpuUnits::whole(10), GpuUnits::whole(3))
        );
        b.set_quota("a", &project_key("p"), quota(0, Some(8)));
        let over = b.check("a", &keys, GpuUnits::whole(1)).unwrap_err();
        assert_eq!(over.scope, LimitScope::Project { project: "p".into() });
    }

    #[test]
    fn usage_decays_by_half_per_half_life_and_fair_share_divides_by_the_guarantee() {
        let mut b = Books::default();
        b.set_quota("a", "training", quota(4, None));
        b.set_quota("a", "training/H100", quota(100, None));
        let keys = vec!["training".to_string()];
        b.account("a", &keys, GpuUnits::whole(2), true, 0, 1000);
        b.decay("a", 1000, 1000);
        // 2 units for 1000 ms on an empty history: 2000 unit-ms; the model-level guarantee
        // does not count towards the share.
        assert_eq!(b.fair_share("a"), 500.0);
        b.account("a", &keys, GpuUnits::whole(2), false, 1000, 1000);
        b.decay("a", 2000, 1000);
        assert_eq!(b.fair_share("a"), 250.0, "halved after one half-life with nothing held");
        assert_eq!(b.fair_share("nobody"), 0.0);
    }

    #[test]
    fn budgets_are_exceeded_once_spent() {
        let mut b = Books::default();
        assert!(b.budget_exceeded("a").is_none(), "no budget, no limit");
        b.set_budget("a", Some(10.0));
        b.set_spent("a", 9.9);
        assert!(b.budget_exceeded("a").is_none());
        b.set_spent("a", 10.0);
        assert_eq!(b.budget_exceeded("a").map(|e| e.spent), Some(10.0));
    }
}
