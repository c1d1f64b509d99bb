//! An index of the shared pools' nodes by the score of their best choice, per demand type, so
//! that a shared placement reads only the nodes that can win instead of every node of the pool.
//!
//! The shared placer takes the node with the lowest primary score, breaking exact ties at random
//! by reservoir sampling in node order: a node is compared only when its score is at most the
//! best so far (lower: it becomes the best; equal: one draw). Those are the only nodes it needs
//! to read, so per (demand type, pool) a min-tree over the nodes' best scores (infinite where
//! the demand cannot go) answers "the next node at or after `i` scoring at most `b`" in
//! O(log n), and a placement visits exactly the nodes the linear scan would have compared, in
//! the same order, drawing the same random numbers: the same decision.
//!
//! A node's score changes only with its epoch (its state, fences), the policy's epoch, and
//! whether tenants are kept apart per node (the device binding). Every epoch change of a shared
//! pool's node is appended to the pool's [`ChangeLog`]; a tree brings itself up to date from
//! the log when it is next read (recomputing only the nodes changed since), and is rebuilt
//! whole when the policy or the binding changed or the log was cut.

use crate::policy::Choice;

/// The nodes of one pool whose epoch changed, in order, numbered from `base`.
#[derive(Clone, Debug, Default)]
pub(super) struct ChangeLog {
    base: u64,
    nodes: Vec<u32>,
}

impl ChangeLog {
    /// Records a change of node `n`; `cap` bounds the log (cut whole when it would pass it:
    /// trees behind the cut are rebuilt).
    pub fn push(&mut self, n: u32, cap: usize) {
        if self.nodes.len() >= cap {
            self.base += self.nodes.len() as u64;
            self.nodes.clear();
        }
        self.nodes.push(n);
    }

    /// The sequence number after the last change.
    pub fn end(&self) -> u64 {
        self.base + self.nodes.len() as u64
    }

    /// The changed nodes from sequence number `from` on, if the log still holds them.
    pub fn since(&self, from: u64) -> Option<&[u32]> {
        let skip = from.checked_sub(self.base)?;
        self.nodes.get(skip as usize..)
    }

    /// The node of change `seq`, if the log still holds it.
    pub fn at(&self, seq: u64) -> Option<u32> {
        let i = seq.checked_sub(self.base)?;
        self.nodes.get(i as usize).copied()
    }
}

/// Per node of a pool (by position in the pool), the primary score of the demand's best choice
/// there (`f64::INFINITY` where it cannot go) and that choice, under a min-tree.
pub(super) struct ScoreTree {
    size: usize,
    /// `min[1]` is the root; leaves at `size..size + len`.
    min: Vec<f64>,
    choice: Vec<Option<Choice>>,
    /// The change-log position, policy epoch and per-node tenant isolation it reflects.
    pub seen: u64,
    pub policy_epoch: u64,
    pub node_iso: bool,
}

impl ScoreTree {
    pub fn new(len: usize, seen: u64, policy_epoch: u64, node_iso: bool) -> Self {
        let size = len.next_power_of_two().max(1);
        ScoreTree {
            size,
            min: vec![f64::INFINITY; 2 * size],
            choice: vec![None; len],
            seen,
            policy_epoch,
            node_iso,
        }
    }

    /// Sets position `i` without updating the tree above it (then [`ScoreTree::build`]).
    pub fn init(&mut self, i: usize, best: Option<(Choice, f64)>) {
        self.min[self.size + i] = best.map_or(f64::INFINITY, |b| b.1);
        self.choice[i] = best.map(|b| b.0);
    }

    pub fn build(&mut self) {
        for k in (1..self.size).rev() {
            self.min[k] = self.min[2 * k].min(self.min[2 * k + 1]);
        }
    }

    /// Sets position `i` and the minima above it.
    pub fn set(&mut self, i: usize, best: Option<(Choice, f64)>) {
        self.init(i, best);
        let mut k = (self.size + i) / 2;
        while k >= 1 {
            self.min[k] = self.min[2 * k].min(self.min[2 * k + 1]);
            k /= 2;
        }
    }

    /// The score and choice at position `i`.
    pub fn get(&self, i: usize) -> Option<(Choice, f64)> {
        self.choice[i].map(|c| (c, self.min[self.size + i]))
    }

    /// The first position at or after `from` whose score is at most `bound`.
    pub fn first(&self, from: usize, bound: f64) -> Option<usize> {
        if from >= self.size {
            return None;
        }
        let mut k = self.size + from;
        loop {
            if self.min[k] <= bound {
                while k < self.size {
                    k = if self.min[2 * k] <= bound { 2 * k } else { 2 * k + 1 };
                }
                return Some(k - self.size);
            }
            // On to the subtree right of this one: up while this is a right child.
            while k & 1 == 1 {
                k >>= 1;
            }
            if k == 0 {
                return None;
            }
            k += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(scores: &[f64]) -> ScoreTree {
        let mut t = ScoreTree::new(scores.len(), 0, 0, false);
        for (i, &s) in scores.iter().enumerate() {
            t.init(i, s.is_finite().then_some((Choice::Host, s)));
        }
        t.build();
        t
    }

    /// The same answer as a scan, for every start and bound.
    #[test]
    fn first_finds_what_a_scan_finds() {
        let inf = f64::INFINITY;
        let scores = [3.0, inf, 1.0, 2.0, 1.0, inf, 5.0];
        let mut t = tree(&scores);
        for round in 0..2 {
            for from in 0..=scores.len() + 1 {
                for bound in [0.5, 1.0, 2.0, 3.0, 4.0, f64::MAX] {
                    let scan = (from..scores.len()).find(|&i| scores[i] <= bound);
                    assert_eq!(t.first(from, bound), scan, "round {round} from {from} bound {bound}");
                }
            }
            // Same answers after point updates.
            t.set(1, Some((Choice::Host, 4.0)));
            t.set(1, None);
        }
        t.set(5, Some((Choice::Gpu(2), 0.0)));
        assert_eq!(t.first(0, 0.5), Some(5));
        assert_eq!(t.get(5), Some((Choice::Gpu(2), 0.0)));
        assert_eq!(t.get(1), None);
        assert_eq!(tree(&[]).first(0, f64::MAX), None);
    }

    #[test]
    fn a_cut_log_no_longer_answers_for_what_it_dropped() {
        let mut log = ChangeLog::default();
        for n in 0..5 {
            log.push(n, 3);
        }
        assert_eq!(log.end(), 5);
        assert_eq!(log.since(3), Some(&[3, 4][..]));
        assert_eq!(log.since(5), Some(&[][..]));
        assert_eq!(log.since(1), None, "cut");
        assert_eq!((log.at(4), log.at(5), log.at(2)), (Some(4), None, None));
    }
}
