//! A statement over the engine, after KAI-Scheduler's: tentative evictions that an action can try
//! ("would the request fit if these stopped?") and undo to a checkpoint. Whatever is still
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

/// Tentative evictions over an engine; see the module doc.
pub(super) struct Statement<'e> {
    engine: &'e mut Engine,
    evicted: Vec<Allocation>,
}

impl<'e> Statement<'e> {
    pub fn new(engine: &'e mut Engine) -> Self {
        Statement {
            engine,
            evicted: Vec::new(),
        }
    }

    /// The engine as the statement leaves it so far.
    pub fn engine(&self) -> &Engine {
        self.engine
    }

    /// Tentatively frees an allocation's capacity; `false` if there is no such allocation.
    pub fn evict(&mut self, id: AllocId) -> bool {
        match self.engine.release(id) {
            Some(a) => {
                self.evicted.push(a);
                true
            }
            None => false,
        }
    }

    /// Whether `req` could be placed in the current trial state.
    pub fn fits(&mut self, req: &Request) -> bool {
        self.engine.plan(req).is_ok()
    }

    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint(self.evicted.len())
    }

    /// The allocations evicted since `cp`, in eviction order.
    pub fn evicted_since(&self, cp: Checkpoint) -> impl Iterator<Item = AllocId> + '_ {
        self.evicted[cp.0..].iter().map(|a| a.id)
    }

    /// Puts back everything evicted since `cp`, last first.
    pub fn rollback(&mut self, cp: Checkpoint) {
        while self.evicted.len() > cp.0 {
            let a = self.evicted.pop().expect("non-empty");
            self.engine
                .restore(a)
                .expect("an allocation evicted in this statement fits back");
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
