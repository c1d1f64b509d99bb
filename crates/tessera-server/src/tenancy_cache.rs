//! What the create path remembers of the tenancy between requests: which `tenant/project`
//! pairs exist, and each tenant's record (its granted priority classes), so that a creation
//! reads neither from the database.
//!
//! Correct because every tenancy write on this replica goes through the server's store
//! ([`crate::timed::TimedStore`]), which calls [`TenancyCache::forget`] after each one, and a
//! replica only creates workloads while it leads (followers forward writes): a leader sees
//! every tenancy write of its term. Entries are kept per lease epoch, so a replica that leads
//! again after another one did (and may have changed the tenancy) reads afresh. A look-up that
//! raced with a write is not kept: an entry is stored only if no write finished since its
//! read began ([`TenancyCache::generation`]).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use tessera_store::TenantRecord;

/// Tenants remembered at most, with projects or records (a clear beyond it; a fleet has far
/// fewer).
const MAX_ENTRIES: usize = 100_000;

/// The remembered tenancy of one leadership term.
#[derive(Debug, Default)]
pub struct TenancyCache {
    /// Bumped by every tenancy write.
    generation: AtomicU64,
    inner: RwLock<Entries>,
}

#[derive(Debug, Default)]
struct Entries {
    /// The generation and lease epoch the entries belong to.
    generation: u64,
    epoch: Option<u64>,
    /// Projects known to exist, by tenant.
    projects: HashMap<String, HashSet<String>>,
    tenants: HashMap<String, Arc<TenantRecord>>,
}

impl TenancyCache {
    /// The generation now: pass it to `remember_*` after reading the store.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Forgets everything (after a tenancy write).
    pub fn forget(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        let mut e = self.inner.write().expect("lock");
        e.projects.clear();
        e.tenants.clear();
    }

    /// Whether `tenant/project` is known to exist, in lease `epoch`.
    pub fn project_known(&self, epoch: Option<u64>, tenant: &str, project: &str) -> bool {
        let e = self.inner.read().expect("lock");
        self.current(&e, epoch) && e.projects.get(tenant).is_some_and(|p| p.contains(project))
    }

    /// A tenant's record as remembered in lease `epoch`.
    pub fn tenant(&self, epoch: Option<u64>, name: &str) -> Option<Arc<TenantRecord>> {
        let e = self.inner.read().expect("lock");
        if self.current(&e, epoch) {
            e.tenants.get(name).cloned()
        } else {
            None
        }
    }

    /// Remembers that `tenant/project` exists, read from the store at `generation`.
    pub fn remember_project(&self, generation: u64, epoch: Option<u64>, tenant: &str, project: &str) {
        self.remember(generation, epoch, |e| {
            e.projects
                .entry(tenant.to_string())
                .or_default()
                .insert(project.to_string());
        });
    }

    /// Remembers a tenant's record, read from the store at `generation`.
    pub fn remember_tenant(&self, generation: u64, epoch: Option<u64>, t: Arc<TenantRecord>) {
        self.remember(generation, epoch, |e| {
            e.tenants.insert(t.name.clone(), t);
        });
    }

    fn current(&self, e: &Entries, epoch: Option<u64>) -> bool {
        e.generation == self.generation() && e.epoch == epoch
    }

    fn remember(&self, generation: u64, epoch: Option<u64>, f: impl FnOnce(&mut Entries)) {
        let mut e = self.inner.write().expect("lock");
        // A write finished since the read began: what was read may be stale.
        if generation != self.generation() {
            return;
        }
        if e.generation != generation || e.epoch != epoch || e.projects.len() + e.tenants.len() >= MAX_ENTRIES {
            *e = Entries {
                generation,
                epoch,
                ..Entries::default()
            };
        }
        f(&mut e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(name: &str, classes: &[&str]) -> Arc<TenantRecord> {
        Arc::new(TenantRecord {
            name: name.into(),
            display_name: name.into(),
            created_at: 0,
            priorities: Some(classes.iter().map(|c| c.to_string()).collect()),
        })
    }

    #[test]
    fn a_write_forgets_what_was_read_before_it() {
        let c = TenancyCache::default();
        let g = c.generation();
        c.remember_tenant(g, None, tenant("nlp", &["standard"]));
        c.remember_project(g, None, "nlp", "main");
        assert!(c.project_known(None, "nlp", "main"));
        assert_eq!(
            c.tenant(None, "nlp").unwrap().priorities.as_deref(),
            Some(&["standard".to_string()][..])
        );
        c.forget();
        assert!(!c.project_known(None, "nlp", "main"));
        assert!(c.tenant(None, "nlp").is_none());
    }

    #[test]
    fn a_read_that_raced_with_a_write_is_not_kept() {
        let c = TenancyCache::default();
        // The read began before the grant changed and finished after it: its value is stale.
        let g = c.generation();
        c.forget();
        c.remember_tenant(g, None, tenant("nlp", &["standard"]));
        c.remember_project(g, None, "nlp", "main");
        assert!(c.tenant(None, "nlp").is_none());
        assert!(!c.project_known(None, "nlp", "main"));
        // A read that began after it is kept.
        c.remember_tenant(c.generation(), None, tenant("nlp", &["standard", "high"]));
        assert_eq!(c.tenant(None, "nlp").unwrap().priorities.as_ref().unwrap().len(), 2);
    }

    #[test]
    fn another_lease_epoch_reads_afresh() {
        let c = TenancyCache::default();
        c.remember_tenant(c.generation(), Some(3), tenant("nlp", &["standard"]));
        c.remember_project(c.generation(), Some(3), "nlp", "main");
        assert!(c.tenant(Some(3), "nlp").is_some());
        // Leading again in a later term: another leader may have changed the tenancy.
        assert!(c.tenant(Some(5), "nlp").is_none());
        assert!(!c.project_known(Some(5), "nlp", "main"));
        // Remembering in the new term drops the old term's entries.
        c.remember_tenant(c.generation(), Some(5), tenant("vision", &["standard"]));
        assert!(c.tenant(Some(3), "nlp").is_none());
        assert!(c.tenant(Some(5), "vision").is_some());
    }
}
