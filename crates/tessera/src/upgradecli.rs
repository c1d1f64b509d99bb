//! Rolling upgrades from the CLI (platform-admin): `upgrade rollout --pool P` starts one and
//! prints its plan (with `--wait`, a progress bar until it ends), `upgrade status [ID]` shows
//! one or lists them, `upgrade cancel ID` stops it from taking more nodes. `tessera node done
//! NODE` (in [`crate::opscli`]) is the hook that says a node's upgrade is finished.

use std::time::Duration;

use anyhow::{Result, bail};
use clap::{Subcommand, ValueEnum};
use reqwest::Method;
use tessera_api::{CreateRollout, RolloutAfter, RolloutView};

use crate::cli::{Common, Output, parse_duration, print_json, table};
use crate::client::Client;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum After {
    Preempt,
    Wait,
}

#[derive(Subcommand)]
pub enum UpgradeCmd {
    /// Upgrade every node of a pool: nodes whose work ends soonest first, drained (nothing is
    /// cut off), upgraded, validated, uncordoned.
    Rollout {
        /// The pool to upgrade.
        #[arg(long)]
        pool: String,
        /// Nodes out at once.
        #[arg(long, default_value_t = 1)]
        max_parallel: u32,
        /// GPU units out at once (default: no limit beyond --max-parallel).
        #[arg(long)]
        max_unavailable_units: Option<u32>,
        /// Per-node drain deadline (90s, 30m, 2h); default: none.
        #[arg(long)]
        deadline: Option<String>,
        /// At a node's deadline: `preempt` what is left, or `wait`.
        #[arg(long, value_enum, default_value_t = After::Wait)]
        after: After,
        /// Show a progress bar until the rollout ends.
        #[arg(long)]
        wait: bool,
    },
    /// One rollout with the state of each node, or every rollout.
    Status { id: Option<u64> },
    /// Take no more nodes; nodes already out finish.
    Cancel { id: u64 },
}

fn print_rollout(r: &RolloutView) {
    println!(
        "rollout {} of pool {}: {} ({:.0} % done){}",
        r.id,
        r.pool,
        r.state,
        r.progress * 100.0,
        if r.detail.is_empty() {
            String::new()
        } else {
            format!(" — {}", r.detail)
        }
    );
    let rows: Vec<Vec<String>> = r
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            vec![
                (i + 1).to_string(),
                n.node.clone(),
                n.state.clone(),
                n.since.clone(),
                n.detail.clone(),
            ]
        })
        .collect();
    println!("{}", table(&["#", "NODE", "STATE", "SINCE", "DETAIL"], &rows));
}

fn counts(r: &RolloutView) -> String {
    let mut parts = Vec::new();
    for st in ["draining", "upgrading", "validating", "failed"] {
        let n = r.nodes.iter().filter(|x| x.state == st).count();
        if n > 0 {
            parts.push(format!("{n} {st}"));
        }
    }
    parts.join(", ")
}

/// A live progress bar until the rollout ends; an error when it did not end `done`.
async fn follow(client: &Client, id: u64) -> Result<()> {
    let mut r: RolloutView = client.get(&format!("/api/v1/rollouts/{id}")).await?;
    let bar = indicatif::ProgressBar::new(r.nodes.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} nodes {msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    loop {
        let done = r.nodes.iter().filter(|n| n.state == "done").count();
        bar.set_position(done as u64);
        bar.set_message(counts(&r));
        if r.state != "running"
            && !r
                .nodes
                .iter()
                .any(|n| matches!(n.state.as_str(), "draining" | "upgrading" | "validating"))
        {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        r = client.get(&format!("/api/v1/rollouts/{id}")).await?;
    }
    bar.finish_with_message(r.state.clone());
    match r.state.as_str() {
        "done" => Ok(()),
        st => bail!("rollout {id} ended {st}: {}", r.detail),
    }
}

pub async fn upgrade(c: &Common, cmd: UpgradeCmd) -> Result<()> {
    let client = Client::new(&c.conn)?;
    match cmd {
        UpgradeCmd::Rollout {
            pool,
            max_parallel,
            max_unavailable_units,
            deadline,
            after,
            wait,
        } => {
            let deadline_s = deadline
                .map(|d| {
                    parse_duration(&d)
                        .map(|s| s as u64)
                        .map_err(|e| anyhow::anyhow!(e.to_string().replace("--duration", "--deadline")))
                })
                .transpose()?;
            let body = CreateRollout {
                pool,
                max_parallel: Some(max_parallel),
                max_unavailable_units,
                deadline_s,
                after: Some(match after {
                    After::Preempt => RolloutAfter::Preempt,
                    After::Wait => RolloutAfter::Wait,
                }),
            };
            let (_, r): (_, RolloutView) = client.call(Method::POST, "/api/v1/rollouts", Some(&body), &[]).await?;
            match c.output {
                Output::Json | Output::Csv => print_json(&r)?,
                Output::Table => print_rollout(&r),
            }
            if wait { follow(&client, r.id).await } else { Ok(()) }
        }
        UpgradeCmd::Status { id: Some(id) } => {
            let r: RolloutView = client.get(&format!("/api/v1/rollouts/{id}")).await?;
            match c.output {
                Output::Json | Output::Csv => print_json(&r),
                Output::Table => {
                    print_rollout(&r);
                    Ok(())
                }
            }
        }
        UpgradeCmd::Status { id: None } => {
            let all: Vec<RolloutView> = crate::cli::all_pages(&client, "/api/v1/rollouts?").await?;
            match c.output {
                Output::Json | Output::Csv => print_json(&all),
                Output::Table => {
                    if all.is_empty() {
                        println!("no rollouts");
                        return Ok(());
                    }
                    let rows: Vec<Vec<String>> = all
                        .iter()
                        .map(|r| {
                            let done = r.nodes.iter().filter(|n| n.state == "done").count();
                            vec![
                                r.id.to_string(),
                                r.pool.clone(),
                                r.state.clone(),
                                format!("{done}/{}", r.nodes.len()),
                                r.created_at.clone(),
                                r.detail.clone(),
                            ]
                        })
                        .collect();
                    println!(
                        "{}",
                        table(&["ID", "POOL", "STATE", "DONE", "CREATED", "DETAIL"], &rows)
                    );
                    Ok(())
                }
            }
        }
        UpgradeCmd::Cancel { id } => {
            let (_, r): (_, RolloutView) = client
                .call::<(), RolloutView>(Method::POST, &format!("/api/v1/rollouts/{id}/cancel"), None, &[])
                .await?;
            println!("rollout {id} cancelled: no more nodes are taken; {}", counts(&r));
            Ok(())
        }
    }
}
