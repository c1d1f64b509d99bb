//! `tessera sim openb --timed`: the openb trace replayed in time through the scheduler cycle
//! ([`tessera_sched::timed`]), printed as a summary, waits per QoS class, refusals and a
//! one-line chart of allocation over time, or as one JSON object.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Result, bail};
use tessera_model::Fleet;
use tessera_sched::replay::POLICIES;
use tessera_sched::timed::{self, TimedConfig, TimedReport, TracePod, WaitStats};

use crate::sim::{OpenbArgs, read};

/// The trace's node list and timed pod list, as `--trace-dir`, `--nodes` and `--pods` say.
pub fn load_trace(
    trace_dir: &std::path::Path,
    nodes: Option<&std::path::Path>,
    pods: Option<&std::path::Path>,
) -> Result<(Fleet, Vec<TracePod>)> {
    let nodes_path = nodes
        .map(|p| p.to_path_buf())
        .unwrap_or_else(|| trace_dir.join("openb_node_list_gpu_node.csv"));
    let pods_path = pods
        .map(|p| p.to_path_buf())
        .unwrap_or_else(|| trace_dir.join("openb_pod_list_default.csv"));
    let fleet = Fleet::from_openb_nodes(&read(&nodes_path, "node list")?, &nodes_path.display().to_string())?;
    let pods = timed::parse_trace(
        &read(&pods_path, "pod list")?,
        &pods_path.display().to_string(),
        &fleet.catalogue,
    )?;
    Ok((fleet, pods))
}

pub fn openb_timed(a: &OpenbArgs, seed: u64) -> Result<()> {
    if !POLICIES.contains(&a.policy.as_str()) {
        bail!(
            "--policy: unknown policy `{}` (one of: {})",
            a.policy,
            POLICIES.join(", ")
        );
    }
    if a.days.is_some_and(|d| !d.is_finite() || d <= 0.0) {
        bail!("--days must be a positive number");
    }
    let (fleet, pods) = load_trace(&a.trace_dir, a.nodes.as_deref(), a.pods.as_deref())?;
    let arrivals = timed::trace_arrivals(&pods, &fleet, a.days, a.limit);
    if arrivals.is_empty() {
        bail!("no pod of the trace is left after --days/--limit");
    }
    let cfg = TimedConfig {
        policy: a.policy.clone(),
        seed,
        tick_ms: a.tick as i64 * 1000,
        samples: a.samples.max(2),
        ..Default::default()
    };
    let started = Instant::now();
    let r = timed::run_timed(Arc::new(fleet), &arrivals, &cfg).map_err(anyhow::Error::msg)?;
    let wall = started.elapsed().as_secs_f64();
    if a.json {
        let mut v = serde_json::to_value(&r)?;
        v["policy"] = a.policy.clone().into();
        v["wall_seconds"] = ((wall * 1000.0).round() / 1000.0).into();
        println!("{v}");
        return Ok(());
    }
    println!(
        "openb timed replay: {} pods over {:.1} days on {} GPUs; policy {}; wall {wall:.1} s",
        r.requests,
        r.span_s / 86_400.0,
        r.gpus,
        a.policy
    );
    print_report(&r);
    Ok(())
}

/// The human view of a timed replay (shared with `tessera plan`).
pub fn print_report(r: &TimedReport) {
    println!(
        "placed {}, refused {}, never placed {}, preemptions {}, queue up to {}, {} cycles",
        r.placed, r.refused, r.never_placed, r.preemptions, r.max_queued, r.cycles
    );
    println!(
        "allocation: {:.2} % time-weighted, peak {:.2} %",
        r.allocated_pct, r.peak_allocated_pct
    );
    let peak = r.series.iter().map(|s| s.allocated_pct).fold(0.0, f64::max);
    println!(
        "allocation over time (0 .. {:.2} %): {}",
        peak,
        sparkline(&r.series.iter().map(|s| s.allocated_pct).collect::<Vec<_>>())
    );
    println!(
        "{:<12} {:>7} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "CLASS", "PLACED", "MEAN (s)", "P50 (s)", "P95 (s)", "P99 (s)", "MAX (s)"
    );
    let row = |k: &str, w: &WaitStats| {
        println!(
            "{k:<12} {:>7} {:>10.1} {:>10.0} {:>10.0} {:>10.0} {:>10.0}",
            w.placed, w.mean_s, w.p50_s, w.p95_s, w.p99_s, w.max_s
        );
    };
    for (k, w) in &r.by_class {
        row(k, w);
    }
    row("all", &r.waits);
    for f in &r.refusals {
        println!("refused ({}): {} — e.g. {}", f.code, f.count, f.examples.join("; "));
    }
}

/// A one-line chart of `values` scaled to their maximum.
pub fn sparkline(values: &[f64]) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let max = values.iter().copied().fold(0.0, f64::max);
    values
        .iter()
        .map(|v| {
            if max <= 0.0 {
                BARS[0]
            } else {
                BARS[((v / max) * 7.0).round().clamp(0.0, 7.0) as usize]
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparkline_scales_to_the_maximum() {
        assert_eq!(sparkline(&[0.0, 50.0, 100.0]), "▁▅█");
        assert_eq!(sparkline(&[0.0, 0.0]), "▁▁");
    }
}
