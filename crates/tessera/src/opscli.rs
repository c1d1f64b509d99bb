//! Fleet-operation verbs of the CLI (platform-admin): `gpu health` lists the GPUs out of
//! placement because they failed, `gpu clear NODE/GPU` puts one back; `node cordon|drain|
//! maintenance|uncordon NODE` changes a node's state; `node mig enable|disable NODE[/GPU]`
//! switches MIG mode of a drained GPU (or of every GPU of a drained node).

use anyhow::{Result, anyhow};
use clap::Subcommand;
use reqwest::Method;
use tessera_api::{GpuHealthView, GpuMigView, NodeView, SetMigMode};

use crate::cli::{Common, Output, print_json, table};
use crate::client::Client;

#[derive(Subcommand)]
pub enum GpuCmd {
    /// GPUs out of placement because they failed (critical XID, lost, failed partition).
    Health,
    /// Put a repaired GPU back into placement: NODE/GPU, e.g. `h100-03/7` (audited).
    Clear {
        /// `NODE/GPU`.
        gpu: String,
    },
}

#[derive(Subcommand)]
pub enum NodeCmd {
    /// No new placement on the node; what runs there stays.
    Cordon { node: String },
    /// Cordon, then empty the node without cutting work off: batch work runs to completion,
    /// services move (a replacement runs elsewhere before the old one stops), interactive
    /// work gets a notice. Ends in `maintenance`.
    Drain {
        node: String,
        /// Seconds until the policy below applies (default: no deadline).
        #[arg(long)]
        deadline_s: Option<u64>,
        /// After the deadline: `preempt` what is left (with the grace period; batch work is
        /// requeued) or `wait`.
        #[arg(long, default_value = "wait")]
        after: String,
    },
    /// Mark an empty (drained) node as in maintenance.
    Maintenance { node: String },
    /// Back to `ready`.
    Uncordon { node: String },
    /// Rolling upgrades' hook: the upgrade of this node is finished (it is validated, then
    /// uncordoned).
    Done { node: String },
    /// Switch MIG mode of GPUs of a drained node (cordoned, draining or in maintenance, the GPU
    /// idle): `enable` (the GPU serves MIG instances) or `disable` (it serves whole GPUs).
    /// Tessera never does this on its own. Audited.
    Mig {
        #[command(subcommand)]
        action: MigAction,
    },
}

#[derive(Subcommand)]
pub enum MigAction {
    /// MIG mode on: the GPU serves MIG instances.
    Enable {
        /// `NODE/GPU`, or `NODE` for every GPU of the node.
        target: String,
    },
    /// MIG mode off: the GPU serves whole GPUs.
    Disable {
        /// `NODE/GPU`, or `NODE` for every GPU of the node.
        target: String,
    },
}

/// `tessera node mig enable|disable NODE[/GPU]`: one call per GPU, stopping at the first
/// refusal (the GPUs before it keep their new mode, and say so).
async fn mig(c: &Common, action: MigAction) -> Result<()> {
    let client = Client::new(&c.conn)?;
    let (enabled, target) = match action {
        MigAction::Enable { target } => (true, target),
        MigAction::Disable { target } => (false, target),
    };
    let (node, gpus): (String, Vec<u8>) = if target.contains('/') {
        let (node, gpu) = parse_gpu(&target)?;
        (node, vec![gpu])
    } else {
        let nodes: Vec<NodeView> = crate::cli::all_pages(&client, "/api/v1/nodes?").await?;
        let n = nodes
            .iter()
            .find(|n| n.name == target)
            .ok_or_else(|| anyhow!("no node `{target}` in the fleet"))?;
        (target.clone(), (0..n.gpus).collect())
    };
    let mut views = Vec::new();
    for gpu in gpus {
        let path = format!("/api/v1/nodes/{node}/gpus/{gpu}/mig");
        let v: GpuMigView = client
            .post(&path, &SetMigMode { enabled })
            .await
            .map_err(|e| match views.len() {
                0 => e,
                k => anyhow!("{e} (GPU {gpu}; the {k} GPU(s) before it were switched)"),
            })?;
        if matches!(c.output, Output::Table) {
            let mode = if v.enabled { "on" } else { "off" };
            println!(
                "{}/{}: MIG {mode}{}",
                v.node,
                v.gpu,
                match (v.pending, v.changed) {
                    (true, _) =>
                        " pending a GPU reset (Tessera never resets a GPU); no placement on it until then".to_string(),
                    (false, false) => " already".to_string(),
                    (false, true) => format!("; serves {}", if v.enabled { "MIG instances" } else { "whole GPUs" }),
                }
            );
        }
        views.push(v);
    }
    match c.output {
        Output::Json | Output::Csv => print_json(&views),
        Output::Table => Ok(()),
    }
}

pub async fn node(c: &Common, cmd: NodeCmd) -> Result<()> {
    if let NodeCmd::Mig { action } = cmd {
        return mig(c, action).await;
    }
    let client = Client::new(&c.conn)?;
    let (node, path) = match &cmd {
        NodeCmd::Mig { .. } => unreachable!("handled above"),
        NodeCmd::Cordon { node } => (node, format!("/api/v1/nodes/{node}/cordon")),
        NodeCmd::Maintenance { node } => (node, format!("/api/v1/nodes/{node}/maintenance")),
        NodeCmd::Uncordon { node } => (node, format!("/api/v1/nodes/{node}/uncordon")),
        NodeCmd::Done { node } => (node, format!("/api/v1/nodes/{node}/done")),
        NodeCmd::Drain {
            node,
            deadline_s,
            after,
        } => {
            let mut p = format!("/api/v1/nodes/{node}/drain?after={after}");
            if let Some(d) = deadline_s {
                p.push_str(&format!("&deadline_s={d}"));
            }
            (node, p)
        }
    };
    let (_, v): (_, NodeView) = client.call::<(), NodeView>(Method::POST, &path, None, &[]).await?;
    match c.output {
        Output::Json | Output::Csv => print_json(&v),
        Output::Table => {
            if matches!(cmd, NodeCmd::Done { .. }) {
                println!("node {node}: upgrade done; validation follows, then it is uncordoned");
            } else {
                println!("node {node} is {}", v.state);
            }
            Ok(())
        }
    }
}

/// `NODE/GPU` → its parts, or one readable line.
pub fn parse_gpu(s: &str) -> Result<(String, u8)> {
    let (node, gpu) = s
        .rsplit_once('/')
        .ok_or_else(|| anyhow!("`{s}`: name a GPU as NODE/GPU, e.g. h100-03/7"))?;
    if node.is_empty() {
        return Err(anyhow!("`{s}`: the node name is missing (NODE/GPU, e.g. h100-03/7)"));
    }
    let gpu: u8 = gpu
        .parse()
        .map_err(|_| anyhow!("`{s}`: `{gpu}` is not a GPU index (NODE/GPU, e.g. h100-03/7)"))?;
    Ok((node.to_string(), gpu))
}

pub async fn gpu(c: &Common, cmd: GpuCmd) -> Result<()> {
    let client = Client::new(&c.conn)?;
    match cmd {
        GpuCmd::Health => {
            let items: Vec<GpuHealthView> = client.get("/api/v1/gpus/health").await?;
            match c.output {
                Output::Json | Output::Csv => print_json(&items),
                Output::Table => {
                    if items.is_empty() {
                        println!("all GPUs are healthy");
                        return Ok(());
                    }
                    let rows: Vec<Vec<String>> = items
                        .iter()
                        .map(|g| {
                            vec![
                                format!("{}/{}", g.node, g.gpu),
                                g.pool.clone(),
                                g.model.clone(),
                                g.xid.map(|x| x.to_string()).unwrap_or_else(|| "-".into()),
                                g.since.clone(),
                                g.workloads.iter().map(u64::to_string).collect::<Vec<_>>().join(","),
                                g.detail.clone(),
                            ]
                        })
                        .collect();
                    println!(
                        "{}",
                        table(&["GPU", "POOL", "MODEL", "XID", "SINCE", "WORKLOADS", "DETAIL"], &rows)
                    );
                    Ok(())
                }
            }
        }
        GpuCmd::Clear { gpu } => {
            let (node, index) = parse_gpu(&gpu)?;
            client
                .call::<(), serde_json::Value>(Method::POST, &format!("/api/v1/gpus/{node}/{index}/clear"), None, &[])
                .await?;
            println!("GPU {index} of {node} is back in placement");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_names_parse_or_say_why_not() {
        assert_eq!(parse_gpu("h100-03/7").unwrap(), ("h100-03".into(), 7));
        for (bad, says) in [
            ("h100-03", "NODE/GPU"),
            ("/3", "node name is missing"),
            ("h100-03/x", "`x` is not a GPU index"),
            ("h100-03/300", "not a GPU index"),
        ] {
            let e = parse_gpu(bad).unwrap_err().to_string();
            assert!(e.contains(says) && !e.contains('\n'), "{bad}: {e}");
        }
    }
}
