//! The waiting jobs, kept in queue order as they come and go, so that a cycle reads the head of
//! the queue without sorting all of it.
//!
//! Jobs are bucketed by tenant, priority class and capacity key (what decides whether a request
//! finds room). Within a bucket the rank and the fair share are the same for every job, so the
//! bucket is kept sorted by the queue-order key computed with a zero fair share
//! ([`QueueOrder`](super::plugins::QueueOrder) promises that the relative order of one tenant's
//! jobs of one class does not depend on the share). A cycle merges the buckets' heads by the full
//! key at the current fair shares and stops after the jobs it takes; past the head of the queue
//! a bucket whose capacity key is known to find no room is dropped whole, in O(1). Reading the
//! first `k` jobs of `n` costs O(buckets + k log buckets), inserting or removing one O(log n).
//!
//! Tenants are numbered once, the first time the queue sees them ([`WaitQueue::tenant_no`]), and
//! a job carries its tenant's number: what a cycle counts per tenant (its fair share, the jobs it
//! took, the jobs waiting) it keeps in vectors indexed by that number, with no name hashed or
//! copied per job.

use std::cmp::Reverse;
use std::collections::btree_map::Values;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::Arc;

use rustc_hash::FxHashMap;

use tessera_model::Request;

use super::Queued;
use super::plugins::OrderKey;

/// The waiting jobs: by id, in arrival order, and per (tenant, class rank) in queue order.
#[derive(Default)]
pub(super) struct WaitQueue {
    by_id: FxHashMap<u64, Arc<Queued>>,
    /// Arrival sequence → job id.
    arrivals: BTreeMap<u64, u64>,
    /// (tenant number, rank, capacity key) → (key at zero fair share → job).
    buckets: FxHashMap<(usize, u8, Request), BTreeMap<OrderKey, Arc<Queued>>>,
    /// Tenant name → its number, and by number: the name and its waiting jobs. Numbers are
    /// never reused (a scheduler sees few tenants).
    numbers: FxHashMap<String, usize>,
    names: Vec<String>,
    waiting: Vec<usize>,
    next_seq: u64,
}

impl WaitQueue {
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn get(&self, id: u64) -> Option<&Arc<Queued>> {
        self.by_id.get(&id)
    }

    pub fn contains(&self, id: u64) -> bool {
        self.by_id.contains_key(&id)
    }

    /// The next arrival sequence number (a job's `seq`).
    pub fn next_seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }

    /// The number of `tenant` (a job's `tenant`), given the first time it is asked for.
    pub fn tenant_no(&mut self, tenant: &str) -> usize {
        if let Some(&n) = self.numbers.get(tenant) {
            return n;
        }
        let n = self.names.len();
        self.numbers.insert(tenant.to_string(), n);
        self.names.push(tenant.to_string());
        self.waiting.push(0);
        n
    }

    /// How many tenants have a number: every job's `tenant` is below it.
    pub fn tenant_count(&self) -> usize {
        self.names.len()
    }

    /// Adds a job (its `seq`, `tenant`, `rank` and `base_key` set, `tenant` from
    /// [`tenant_no`](Self::tenant_no)). A job already queued under the same id is replaced.
    pub fn push(&mut self, q: Arc<Queued>) {
        self.remove(q.job.id);
        self.arrivals.insert(q.seq, q.job.id);
        self.buckets
            .entry((q.tenant, q.rank, q.key.clone()))
            .or_default()
            .insert(q.base_key, q.clone());
        self.waiting[q.tenant] += 1;
        self.by_id.insert(q.job.id, q);
    }

    pub fn remove(&mut self, id: u64) -> Option<Arc<Queued>> {
        let q = self.by_id.remove(&id)?;
        self.arrivals.remove(&q.seq);
        self.waiting[q.tenant] -= 1;
        let bucket = (q.tenant, q.rank, q.key.clone());
        if let Some(b) = self.buckets.get_mut(&bucket) {
            b.remove(&q.base_key);
            if b.is_empty() {
                self.buckets.remove(&bucket);
            }
        }
        Some(q)
    }

    /// The waiting jobs in arrival order.
    pub fn in_arrival_order(&self) -> impl Iterator<Item = &Arc<Queued>> {
        self.arrivals.values().map(|id| &self.by_id[id])
    }

    /// The tenants with waiting jobs (each once, by name): number and name.
    pub fn tenants(&self) -> Vec<(usize, &str)> {
        let mut t: Vec<(usize, &str)> = (0..self.names.len())
            .filter(|&n| self.waiting[n] > 0)
            .map(|n| (n, self.names[n].as_str()))
            .collect();
        t.sort_unstable_by_key(|&(_, name)| name);
        t
    }

    /// Every job (for a full rebuild when the queue-order policy changes). Tenants keep their
    /// numbers.
    pub fn drain(&mut self) -> Vec<Arc<Queued>> {
        let all: Vec<Arc<Queued>> = self.in_arrival_order().cloned().collect();
        self.by_id.clear();
        self.arrivals.clear();
        self.buckets.clear();
        self.waiting.iter_mut().for_each(|n| *n = 0);
        all
    }

    /// Up to `limit` jobs in queue order by `key` (the full key of a job), skipping those `skip`
    /// says to: the first `head` whatever they are, then only jobs that `unfit` does not say
    /// find no room (it is asked once per bucket: a bucket shares one capacity key). A k-way
    /// merge of the buckets' heads. Also says whether jobs that might fit were left out.
    ///
    /// **Fair across tenants.** Jobs are taken tier by tier (a tier: the first field of the
    /// key, the priority class in the default order), all of a tier before any of the next.
    /// Within the tier where `limit` runs out, each tenant waiting there gets its share of what
    /// is left (the rest divided by the number of those tenants, rounded up) before the jobs of
    /// tenants past their share take what the others left unused, in queue order. So one
    /// tenant's deep queue cannot keep another tenant's jobs of the same class out of every
    /// cycle. The jobs come back in queue order.
    pub fn first<'a>(
        &'a self,
        head: usize,
        limit: usize,
        key: impl Fn(&Queued) -> OrderKey,
        skip: impl Fn(u64) -> bool,
        mut unfit: impl FnMut(&Queued) -> bool,
    ) -> (Vec<Arc<Queued>>, bool) {
        if limit == 0 {
            return (Vec::new(), !self.by_id.is_empty());
        }
        let mut out: Vec<(OrderKey, Arc<Queued>)> = Vec::with_capacity(limit.min(self.by_id.len()));
        // Each bucket's tenant number, so that shares are counted in vectors.
        let mut tenant_of: Vec<usize> = Vec::with_capacity(self.buckets.len());
        let mut iters: Vec<_> = Vec::with_capacity(self.buckets.len());
        for (&(tenant, _, _), b) in &self.buckets {
            tenant_of.push(tenant);
            iters.push(b.values());
        }
        let mut taken = vec![0usize; self.names.len()];
        let mut seen = vec![false; self.names.len()];
        // The heap holds each bucket's first job not taken yet: (key, id, bucket), the job
        // itself in `heads`.
        let mut heap: BinaryHeap<Reverse<(OrderKey, u64, usize)>> = BinaryHeap::with_capacity(iters.len());
        let mut heads: Vec<Option<&Arc<Queued>>> = vec![None; iters.len()];
        let advance = |i: usize,
                       iters: &mut [Values<'a, OrderKey, Arc<Queued>>],
                       heads: &mut [Option<&'a Arc<Queued>>],
                       heap: &mut BinaryHeap<_>| {
            for q in iters[i].by_ref() {
                if skip(q.job.id) {
                    continue;
                }
                heap.push(Reverse((key(q), q.job.id, i)));
                heads[i] = Some(q);
                return;
            }
        };
        for i in 0..iters.len() {
            advance(i, &mut iters, &mut heads, &mut heap);
        }
        // The tier being taken, each tenant's share of it, and the heads of the buckets of
        // tenants past their share (held back until the tier is otherwise exhausted).
        let mut tier: Option<u8> = None;
        let mut share = usize::MAX;
        let mut held: Vec<Reverse<(OrderKey, u64, usize)>> = Vec::new();
        let mut reordered = false;
        while out.len() < limit {
            let next = heap.peek().map(|Reverse((k, _, _))| k.0);
            if next != tier {
                if !held.is_empty() {
                    // The tier's other jobs are all taken: what is left of the budget goes to
                    // the held-back jobs in queue order.
                    heap.extend(held.drain(..));
                    share = usize::MAX;
                    reordered = true;
                    continue;
                }
                let Some(t) = next else { break };
                tier = Some(t);
                taken.iter_mut().for_each(|n| *n = 0);
                seen.iter_mut().for_each(|s| *s = false);
                let mut tenants = 0;
                for Reverse((k, _, i)) in heap.iter() {
                    if k.0 == t && !std::mem::replace(&mut seen[tenant_of[*i]], true) {
                        tenants += 1;
                    }
                }
                share = (limit - out.len()).div_ceil(tenants.max(1));
            }
            let Some(Reverse((k, id, i))) = heap.pop() else { break };
            let q = heads[i].expect("a bucket in the heap has a head");
            if out.len() >= head && unfit(q) {
                // The rest of the bucket has the same capacity key: none of it fits either.
                continue;
            }
            let n = &mut taken[tenant_of[i]];
            if *n >= share {
                // Past its tenant's share: the bucket waits here.
                held.push(Reverse((k, id, i)));
                continue;
            }
            *n += 1;
            out.push((k, q.clone()));
            advance(i, &mut iters, &mut heads, &mut heap);
        }
        let cut = !heap.is_empty() || !held.is_empty();
        if reordered {
            out.sort_unstable_by_key(|(k, q)| (*k, q.job.id));
        }
        (out.into_iter().map(|(_, q)| q).collect(), cut)
    }

    /// How many jobs the tenant numbered `tenant` has waiting.
    pub fn waiting_of(&self, tenant: usize) -> usize {
        self.waiting.get(tenant).copied().unwrap_or(0)
    }
}
