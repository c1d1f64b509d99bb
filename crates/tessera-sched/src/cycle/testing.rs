//! What the cycle's tests share: a scheduler on the seed fleet and small helpers.

use std::sync::Arc;

use tessera_model::{Fleet, GpuUnits, PoolId, Request};

use super::{Decision, GovernConfig, Job, Quota, Scheduler};
use crate::engine::Engine;
use crate::policy::BestFit;

/// Short minimum runtime, immediate reclaim: the tests move time by hand.
pub fn config() -> GovernConfig {
    GovernConfig {
        min_runtime_ms: 1000,
        reclaim_after_ms: 0,
        ..Default::default()
    }
}

pub fn engine() -> Engine {
    Engine::new(Arc::new(Fleet::seed()), Box::new(BestFit), 1)
}

pub fn sched() -> Scheduler {
    Scheduler::new(engine(), config())
}

/// Tenants `a` and `b` are each guaranteed 64 GPUs of the training pool (its half), with an
/// optional limit in whole GPUs.
pub fn guarantee_half_each(s: &mut Scheduler, limit: Option<u64>) {
    for t in ["a", "b"] {
        s.set_quota(
            t,
            "training",
            Some(Quota {
                guaranteed: GpuUnits::whole(64),
                limit: limit.map(GpuUnits::whole),
            }),
        );
    }
}

/// `gpus` whole GPUs in the training pool.
pub fn job(id: u64, tenant: &str, gpus: u8, prio: &str, now: i64) -> Job {
    Job::new(id, tenant, "p", Request::whole(gpus).with_pool(PoolId(0)), prio, now)
}

pub fn placed(d: &[Decision]) -> Vec<u64> {
    d.iter()
        .filter_map(|x| match x {
            Decision::Placed { id, .. } => Some(*id),
            _ => None,
        })
        .collect()
}

/// The reasons of the waiting decisions, as text.
pub fn waiting(d: &[Decision]) -> Vec<String> {
    d.iter()
        .filter_map(|x| match x {
            Decision::Waiting { reason, .. } => Some(reason.to_string()),
            _ => None,
        })
        .collect()
}

pub fn preempted(d: &[Decision]) -> Vec<u64> {
    d.iter()
        .filter_map(|x| match x {
            Decision::Preempt { victim, .. } => Some(*victim),
            _ => None,
        })
        .collect()
}
