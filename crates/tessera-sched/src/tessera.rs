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
    lambda: f64,
    mode: f64,
    na: f64,
    kappa: f64,
    /// Per class: CPU milli per GPU milli.
    rc: Vec<f64>,
    seen_epoch: u64,
}

impl TesseraPolicy {
    pub fn new(model: WorkloadModel) -> Self {
        let mut p = TesseraPolicy {
            model,
            alpha: env("T_ALPHA", 0.0),
            ratio: env("T_RATIO", 0.0),
            beta: env("T_BETA", 0.0),
            lambda: env("T_LAMBDA", 0.0),
            mode: env("T_MODE", 0.0),
            na: env("T_NA", 1.0),
            kappa: env("T_KAPPA", 0.0),
            rc: Vec::new(),
            seen_epoch: u64::MAX,
        };
        p.refresh();
        p
    }

    fn refresh(&mut self) {
        if self.seen_epoch == self.model.epoch() {
            return;
        }
        self.seen_epoch = self.model.epoch();
        self.rc = self
            .model
            .classes
            .iter()
            .map(|c| {
                let w: f64 = c.hosts.iter().map(|h| h.2).sum();
                let cpu: f64 = c.hosts.iter().map(|h| h.0 as f64 * h.2).sum();
                cpu / w / (c.gpus as f64 * c.milli as f64)
            })
            .collect();
        if env("T_RATIO", 0.0) <= 0.0 {
            let (mut cpu, mut gpu) = (0.0, 0.0);
            for c in &self.model.classes {
                for h in &c.hosts {
                    cpu += h.0 as f64 * h.2;
                    gpu += c.gpus as f64 * c.milli as f64 * h.2;
                }
            }
            self.ratio = cpu / gpu;
        }
    }

    /// Expected waste: FGD's per-class fragmentation plus CPU stranding, with knobs.
    fn waste(&self, h: &Hypo) -> f64 {
        let gpus = h.gpus();
        let total: u64 = gpus.iter().map(|&f| f as u64).sum();
        if total == 0 {
            return 0.0;
        }
        let full = gpus.iter().filter(|&&f| f == 1000).count() as u8;
        let t = total as f64;
        let mut frag = 0.0;
        for (c, &r) in self.model.classes.iter().zip(&self.rc) {
            if c.models != 0 && (h.model.0 >= 64 || c.models >> h.model.0 & 1 == 0) {
                frag += self.na * c.weight * t;
                continue;
            }
            if c.models != 0 {
                frag -= self.kappa * c.weight * t;
            }
            let fit_w: f64 = c
                .hosts
                .iter()
                .take_while(|h2| h2.0 <= h.cpu_free)
                .filter(|h2| h2.1 <= h.mem_free)
                .map(|h2| h2.2)
                .sum();
            let (gpu_fits, unusable, usable) = if c.gpus == 1 && c.milli < 1000 {
                let fits = gpus.iter().any(|&f| f >= c.milli);
                let un: u64 = gpus
                    .iter()
                    .filter(|&&f| f < c.milli)
                    .map(|&f| f as u64)
                    .sum();
                let us: u64 = gpus
                    .iter()
                    .map(|&f| (f / c.milli) as u64 * c.milli as u64)
                    .sum();
                (fits, un, us)
            } else {
                let un: u64 = gpus.iter().filter(|&&f| f < 1000).map(|&f| f as u64).sum();
                let us = full as u64 / c.gpus as u64 * c.gpus as u64 * 1000;
                (full >= c.gpus, un, us)
            };
            let strand = (usable as f64 - h.cpu_free as f64 / r).max(0.0);
            frag += (c.weight - fit_w) * t
                + fit_w
                    * if gpu_fits {
                        unusable as f64 + self.lambda * strand
                    } else {
                        t
                    };
        }
        frag
    }

    fn stranded(&self, h: &Hypo) -> f64 {
        let g: f64 = h.gpus().iter().map(|&f| f as f64).sum();
        let usable = h.cpu_free as f64 / self.ratio;
        (g - usable).max(0.0)
    }

    /// Per-class CPU stranding: GPU milli a class could use on the node by GPU shape but not
    /// by the node's free CPU.
    fn class_strand(&self, h: &Hypo) -> f64 {
        let gpus = h.gpus();
        let t: u64 = gpus.iter().map(|&f| f as u64).sum();
        if t == 0 {
            return 0.0;
        }
        let full = gpus.iter().filter(|&&f| f == 1000).count() as u64;
        let mut s = 0.0;
        for (c, &r) in self.model.classes.iter().zip(&self.rc) {
            if c.models != 0 && (h.model.0 >= 64 || c.models >> h.model.0 & 1 == 0) {
                continue;
            }
            let usable = if c.gpus == 1 && c.milli < 1000 {
                if self.mode >= 1.0 {
                    gpus.iter()
                        .map(|&f| (f / c.milli) as u64 * c.milli as u64)
                        .sum::<u64>()
                } else {
                    gpus.iter()
                        .filter(|&&f| f >= c.milli)
                        .map(|&f| f as u64)
                        .sum::<u64>()
                }
            } else {
                full / c.gpus as u64 * c.gpus as u64 * 1000
            };
            let cpu_can = h.cpu_free as f64 / r;
            s += c.weight * (usable as f64 - cpu_can).max(0.0);
        }
        s
    }
}

impl SharedPolicy for TesseraPolicy {
    fn name(&self) -> &'static str {
        "tessera"
    }

    fn observe(&mut self, d: &Demand) {
        self.model.observe(d);
        self.refresh();
    }

    fn epoch(&self) -> u64 {
        self.model.epoch()
    }

    fn score(&self, view: &NodeView, d: &Demand, choice: Choice) -> Score {
        let before = Hypo::of(view);
        let after = before.after(d, choice);
        let delta = if self.mode >= 2.0 {
            self.waste(&after) - self.waste(&before)
        } else {
            fgd_fragmentation(&self.model, &after) - fgd_fragmentation(&self.model, &before)
        };
        let strand = if self.alpha != 0.0 {
            self.stranded(&after) - self.stranded(&before)
        } else {
            0.0
        };
        let cs = if self.lambda != 0.0 && self.mode < 2.0 {
            self.class_strand(&after) - self.class_strand(&before)
        } else {
            0.0
        };
        let fill: f64 = after.gpus().iter().map(|&f| f as f64).sum::<f64>() / 1000.0;
        (
            delta + self.alpha * strand + self.lambda * cs + self.beta * fill,
            0.0,
        )
    }
}
