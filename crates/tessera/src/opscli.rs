//! Fleet-operation verbs of the CLI (platform-admin): `gpu health` lists the GPUs out of
//! placement because they failed, `gpu clear NODE/GPU` puts one back.

use anyhow::{Result, anyhow};
use clap::Subcommand;
use reqwest::Method;
use tessera_api::GpuHealthView;

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
