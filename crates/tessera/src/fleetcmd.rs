//! `tessera fleet`: show or validate a fleet description.

use anyhow::Result;
use serde_json::json;
use tessera_model::Fleet;

#[derive(clap::Args)]
pub struct FleetArgs {
    /// `seed`, `synthetic:NODES`, or a TOML fleet file (also as `--fleet`).
    #[arg(value_name = "FLEET", conflicts_with = "fleet")]
    file: Option<String>,
    /// `seed`, `synthetic:NODES`, or a TOML fleet file.
    #[arg(long, default_value = "seed")]
    fleet: String,
    /// Also list the MIG profiles of every MIG-capable model in the fleet.
    #[arg(long)]
    profiles: bool,
    /// The fleet as JSON instead of the text summary.
    #[arg(long)]
    json: bool,
}

pub fn run(a: FleetArgs) -> Result<()> {
    let fleet: Fleet = crate::bench::load_fleet(a.file.as_deref().unwrap_or(&a.fleet))?;
    if a.json {
        let pools: Vec<_> = fleet
            .pools
            .iter()
            .map(|p| {
                let nodes = &fleet.nodes[p.nodes.start as usize..p.nodes.end as usize];
                json!({
                    "name": p.name,
                    "sharing": p.sharing.to_string(),
                    "allow_tenant_mixing": p.allow_tenant_mixing,
                    "nodes": nodes.len(),
                    "gpus": nodes.iter().map(|n| n.gpus as u64).sum::<u64>(),
                })
            })
            .collect();
        println!(
            "{}",
            json!({ "pools": pools, "gpus": fleet.gpu_count(), "nodes": fleet.nodes.len() })
        );
        return Ok(());
    }
    println!("{:<14} {:<7} {:>6} {:>6}  models", "POOL", "SHARING", "NODES", "GPUS");
    for p in &fleet.pools {
        let nodes = &fleet.nodes[p.nodes.start as usize..p.nodes.end as usize];
        let mut models: Vec<&str> = nodes
            .iter()
            .map(|n| fleet.catalogue.get(n.model).name.as_str())
            .collect();
        models.sort_unstable();
        models.dedup();
        println!(
            "{:<14} {:<7} {:>6} {:>6}  {}",
            p.name,
            p.sharing.to_string(),
            nodes.len(),
            nodes.iter().map(|n| n.gpus as u64).sum::<u64>(),
            models.join(", ")
        );
    }
    println!("total: {} nodes, {} GPUs", fleet.nodes.len(), fleet.gpu_count());
    if a.profiles {
        let mut seen = Vec::new();
        for n in &fleet.nodes {
            let m = fleet.catalogue.get(n.model);
            let Some(geom) = m.mig else { continue };
            if seen.contains(&n.model) {
                continue;
            }
            seen.push(n.model);
            println!(
                "\nMIG profiles of {} ({} memory slices, {} SM slices):",
                m.name, geom.mem_slices, geom.sm_slices
            );
            println!(
                "  {:<12} {:>3} {:>5} {:>4} {:>4} {:>6}  placements",
                "PROFILE", "ID", "UNITS", "MEM", "SM", "MAX"
            );
            for p in geom.profiles {
                let starts: Vec<String> = p.starts.iter().map(|s| s.to_string()).collect();
                println!(
                    "  {:<12} {:>3} {:>5} {:>4} {:>4} {:>6}  {{{}}}:{}",
                    m.profile_name(p),
                    p.id,
                    m.profile_units(p).to_string(),
                    p.mem_slices,
                    p.sm_slices,
                    p.max_instances,
                    starts.join(","),
                    p.mem_slices
                );
            }
        }
    }
    Ok(())
}
