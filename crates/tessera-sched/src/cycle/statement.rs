//! A statement over the engine, after KAI-Scheduler's: tentative evictions and placements that an
//! action can try ("would the request fit if these stopped, and would they fit elsewhere?") and
//! undo to a checkpoint. Whatever is still
//! evicted when the statement ends is put back, so a trial never outlives its statement and no
//! caller ever sees the engine in a tried state.
//!
//! Evictions here are only ever trials: a chosen victim keeps its capacity until it has actually
//! stopped and the lifecycle releases it through the scheduler.

use tessera_model::Request;

use crate::engine::Engine;
use crate::state::{AllocId, Allocation};

/// A point to roll a [`Statement`] back to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Checkpoint(usize);

/// One tentative change.
enum Step {
    Evicted(Allocation),
    /// A gang's every share, evicted together.
    EvictedGang {
        id: AllocId,
        pool: tessera_model::PoolId,
        shares: Vec<Allocation>,
    },
    Placed(AllocId),
}

/// Tentative evictions and placements over an engine; see the module doc.
pub(super) struct Statement<'e> {
    engine: &'e mut Engine,
    steps: Vec<Step>,
    /// The engine's freed generations when the statement began: a full rollback puts the state
    /// back exactly, so capacity has not grown and they are put back too.
    freed: Vec<u64>,
}

impl<'e> Statement<'e> {
    pub fn new(engine: &'e mut Engine) -> Self {
        Statement {
            freed: engine.freed_generations(),
            engine,
            steps: Vec::new(),
        }
    }

    /// The engine as the statement leaves it so far.
    pub fn engine(&self) -> &Engine {
        self.engine
    }

    /// Tentatively frees an allocation's capacity (a gang's: every share); `false` if there is
    /// no such allocation.
    pub fn evict(&mut self, id: AllocId) -> bool {
        if let Some(g) = self.engine.gang(id) {
            let pool = g.pool;
            let shares: Vec<Allocation> = g
                .shares
                .iter()
                .filter_map(|s| self.engine.allocation(*s).cloned())
                .collect();
            self.engine.release_gang(id);
            self.steps.push(Step::EvictedGang { id, pool, shares });
            return true;
        }
        match self.engine.release(id) {
            Some(a) => {
                self.steps.push(Step::Evicted(a));
                true
            }
            None => false,
        }
    }

    /// Whether `req` could be placed in the current trial state.
    pub fn fits(&mut self, req: &Request) -> bool {
        self.engine.find(req).is_some()
    }

    /// Tentatively places `req` as allocation `id`; `None` if it does not fit.
    pub fn place(&mut self, id: AllocId, req: &Request) -> Option<Allocation> {
        let a = self.engine.place(id, req).ok()?.clone();
        self.steps.push(Step::Placed(id));
        Some(a)
    }

    /// Where gang `g` would go in the current trial state (nothing is booked).
    pub fn plan_gang(
        &mut self,
        g: &tessera_model::request::GangRequest,
    ) -> Result<crate::engine::GangPlacement, crate::reason::GangUnplaceable> {
        self.engine.plan_gang(g)
    }

    /// Holds nodes back from the trial placements (as [`Engine::set_blocked`]).
    pub fn set_blocked(&mut self, nodes: rustc_hash::FxHashSet<u32>) {
        self.engine.set_blocked(nodes);
    }

    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint(self.steps.len())
    }

    /// The allocations evicted since `cp`, in eviction order.
    pub fn evicted_since(&self, cp: Checkpoint) -> impl Iterator<Item = AllocId> + '_ {
        self.steps[cp.0..].iter().filter_map(|s| match s {
            Step::Evicted(a) => Some(a.id),
            Step::EvictedGang { id, .. } => Some(*id),
            Step::Placed(_) => None,
        })
    }

    /// Undoes everything done since `cp`, last first.
    pub fn rollback(&mut self, cp: Checkpoint) {
        while self.steps.len() > cp.0 {
            match self.steps.pop().expect("non-empty") {
                Step::Evicted(a) => {
                    self.engine
                        .restore(a)
                        .expect("an allocation evicted in this statement fits back");
                }
                Step::EvictedGang { id, pool, shares } => {
                    self.engine
                        .restore_gang(id, pool, shares)
                        .expect("a gang evicted in this statement fits back");
                }
                Step::Placed(id) => {
                    self.engine.release(id).expect("placed in this statement");
                }
            }
        }
        if cp.0 == 0 {
            self.engine.reset_freed_generations(&self.freed);
        }
    }
}

impl Drop for Statement<'_> {
    fn drop(&mut self) {
        self.rollback(Checkpoint(0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cycle::testing::engine;
    use tessera_model::PoolId;

    fn full_training_pool() -> Engine {
        let mut e = engine();
        for id in 0..16 {
            e.place(id, &Request::whole(8).with_pool(PoolId(0))).unwrap();
        }
        e
    }

    #[test]
    fn rollback_to_a_checkpoint_puts_back_only_what_came_after() {
        let mut e = full_training_pool();
        let before = e.state().clone();
        let gang = Request::whole(8).with_pool(PoolId(0));
        let mut st = Statement::new(&mut e);
        assert!(!st.fits(&gang));
        assert!(st.evict(3));
        let cp = st.checkpoint();
        assert!(st.evict(5));
        assert!(!st.evict(5), "already evicted");
        assert_eq!(st.evicted_since(cp).collect::<Vec<_>>(), vec![5]);
        assert!(st.fits(&gang));
        st.rollback(cp);
        assert!(st.engine().allocation(5).is_some());
        assert!(st.engine().allocation(3).is_none(), "evicted before the checkpoint");
        st.rollback(Checkpoint(0));
        assert!(!st.fits(&gang));
        drop(st);
        assert!(e.state().same_holdings(&before));
    }

    #[test]
    fn a_statement_ending_puts_everything_back() {
        let mut e = full_training_pool();
        let before = e.state().clone();
        {
            let mut st = Statement::new(&mut e);
            for id in [1, 2, 7] {
                assert!(st.evict(id));
            }
        }
        assert!(e.state().same_holdings(&before));
        for id in [1, 2, 7] {
            assert!(e.allocation(id).is_some());
        }
    }
}
