//! Tessera's own shared-pool policy.

use crate::policy::{
    Choice, Demand, Hypo, NodeView, Score, SharedPolicy, WorkloadModel, fgd_fragmentation,
};

fn env(name: &str, d: f64) -> f64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

/// Tessera's fragmentation-aware policy for shared pools.
#[derive(Debug)]
pub struct TesseraPolicy {
    pub model: WorkloadModel,
    alpha: f64,
    ratio: f64,
    beta: f64,
}

impl TesseraPolicy {
    pub fn new(model: WorkloadModel) -> Self {
        TesseraPolicy {
            model,
            alpha: env("T_ALPHA", 0.0),
            ratio: env("T_RATIO", 11.0),
            beta: env("T_BETA", 0.0),
        }
    }

    fn stranded(&self, h: &Hypo) -> f64 {
        let g: f64 = h.gpus().iter().map(|&f| f as f64).sum();
        let usable = h.cpu_free as f64 / self.ratio;
        (g - usable).max(0.0)
    }
}

impl SharedPolicy for TesseraPolicy {
    fn name(&self) -> &'static str {
        "tessera"
    }

    fn observe(&mut self, d: &Demand) {
        self.model.observe(d);
    }

    fn epoch(&self) -> u64 {
        self.model.epoch()
    }

    fn score(&self, view: &NodeView, d: &Demand, choice: Choice) -> Score {
        let before = Hypo::of(view);
        let after = before.after(d, choice);
        let delta =
            fgd_fragmentation(&self.model, &after) - fgd_fragmentation(&self.model, &before);
        let strand = self.stranded(&after) - self.stranded(&before);
        let fill: f64 = after.gpus().iter().map(|&f| f as f64).sum::<f64>() / 1000.0;
        (delta + self.alpha * strand + self.beta * fill, 0.0)
    }
}
