//! Governance verbs: `quota get/set/unset`, `budget`, `usage`, and the declarative
//! `apply -f tenants.yaml` (idempotent; `--dry-run` shows the diff).

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use reqwest::Method;
use serde::Deserialize;
use tessera_api::*;
use tessera_model::units::unit_hours;

use crate::cli::{Common, Output, table};
use crate::client::Client;

#[derive(Subcommand)]
pub enum QuotaCmd {
    /// Show a tenant's quotas, use, borrowing and budget.
    Get {
        /// The tenant.
        #[arg(long)]
        tenant: String,
    },
    /// Set a tenant's quota for a class (a pool, pool/MODEL, or project:NAME), in GPU units.
    Set {
        /// The tenant.
        #[arg(long)]
        tenant: String,
        /// A pool (`training`), a pool and GPU model (`training/H100-80GB-SXM`), or one of the
        /// tenant's projects across pools (`project:NAME`).
        #[arg(long)]
        class: String,
        /// GPU units the tenant is guaranteed; above it, it borrows idle capacity that may be
        /// reclaimed.
        #[arg(long)]
        guaranteed: f64,
        /// The most the tenant may hold, borrowing included (default: no limit).
        #[arg(long)]
        limit: Option<f64>,
    },
    /// Remove a tenant's quota for a class.
    Unset {
        /// The tenant.
        #[arg(long)]
        tenant: String,
        /// A pool (`training`), a pool and GPU model (`training/H100-80GB-SXM`), or one of the
        /// tenant's projects across pools (`project:NAME`).
        #[arg(long)]
        class: String,
    },
}

#[derive(Args)]
pub struct BudgetArgs {
    /// The tenant.
    #[arg(long)]
    pub tenant: String,
    /// GPU-unit-hours per calendar month.
    #[arg(long, conflicts_with = "none")]
    pub gpu_hours: Option<f64>,
    /// Remove the budget.
    #[arg(long)]
    pub none: bool,
}

#[derive(Args)]
pub struct UsageArgs {
    /// Only this tenant (a tenant's own tokens see only their tenant).
    #[arg(long)]
    pub tenant: Option<String>,
    /// Start: YYYY-MM-DD or RFC 3339 (default: the first of this month).
    #[arg(long)]
    pub from: Option<String>,
    /// End, exclusive (default: now).
    #[arg(long)]
    pub to: Option<String>,
    /// day, class, project or tenant; or `interval`: the ledger itself, one line per interval
    /// with what its workload asked for (the demand `tessera plan --demand usage:FILE` reads).
    #[arg(long, default_value = "day")]
    pub by: String,
}

#[derive(Args)]
pub struct ApplyArgs {
    /// The declaration: tenants, their projects, quotas, budgets and image policies.
    #[arg(short = 'f', long = "file")]
    pub file: std::path::PathBuf,
    /// Show what would change without changing it.
    #[arg(long)]
    pub dry_run: bool,
}

/// A flag's number of GPU units (or unit-hours): finite and not negative. (clap reads `NaN`
/// and `inf` as numbers, which JSON cannot carry: they would reach the server as `null`.)
fn gpu_units(flag: &str, v: f64) -> Result<f64> {
    if !v.is_finite() {
        bail!("{flag} {v} is not a number of GPU units: give a finite number such as 8 or 0.5");
    }
    if v < 0.0 {
        bail!("{flag} {v} is negative: GPU units are 0 or more");
    }
    Ok(v)
}

fn enc(s: &str) -> String {
    s.replace('/', "%2F")
}

pub async fn quota(c: &Common, cmd: QuotaCmd) -> Result<()> {
    let client = Client::new(&c.conn)?;
    match cmd {
        QuotaCmd::Get { tenant } => {
            let q: TenantQuotas = client.get(&format!("/api/v1/tenants/{tenant}/quotas")).await?;
            if c.output != Output::Table {
                println!("{}", serde_json::to_string_pretty(&q)?);
                return Ok(());
            }
            let rows: Vec<Vec<String>> = q
                .quotas
                .iter()
                .map(|x| {
                    vec![
                        x.class.clone(),
                        x.guaranteed.to_string(),
                        x.limit.map(|l| l.to_string()).unwrap_or_else(|| "-".into()),
                        x.used.to_string(),
                        x.borrowed.to_string(),
                    ]
                })
                .collect();
            println!(
                "{}",
                table(&["CLASS", "GUARANTEED", "LIMIT", "USED", "BORROWED"], &rows)
            );
            match q.budget {
                Some(b) => println!(
                    "budget: {} GPU-unit-hours this month, {} spent, {} left",
                    unit_hours(b.monthly_unit_hours),
                    unit_hours(b.spent_unit_hours),
                    unit_hours(b.remaining_unit_hours)
                ),
                None => println!("budget: none"),
            }
            Ok(())
        }
        QuotaCmd::Set {
            tenant,
            class,
            guaranteed,
            limit,
        } => {
            let guaranteed = gpu_units("--guaranteed", guaranteed)?;
            let limit = limit.map(|l| gpu_units("--limit", l)).transpose()?;
            let (_, q): (_, QuotaView) = client
                .call(
                    Method::PUT,
                    &format!("/api/v1/tenants/{tenant}/quotas/{}", enc(&class)),
                    Some(&SetQuota { guaranteed, limit }),
                    &[],
                )
                .await?;
            println!(
                "quota of {tenant} for {}: guaranteed {}, limit {}",
                q.class,
                q.guaranteed,
                q.limit.map(|l| l.to_string()).unwrap_or("none".into())
            );
            Ok(())
        }
        QuotaCmd::Unset { tenant, class } => {
            client
                .call::<(), serde_json::Value>(
                    Method::DELETE,
                    &format!("/api/v1/tenants/{tenant}/quotas/{}", enc(&class)),
                    None,
                    &[],
                )
                .await?;
            println!("quota of {tenant} for {class} removed");
            Ok(())
        }
    }
}

pub async fn budget(c: &Common, a: BudgetArgs) -> Result<()> {
    let client = Client::new(&c.conn)?;
    if a.gpu_hours.is_none() && !a.none {
        bail!("give --gpu-hours N or --none");
    }
    if let Some(h) = a.gpu_hours {
        gpu_units("--gpu-hours", h)?;
    }
    let body = SetBudget {
        monthly_unit_hours: a.gpu_hours,
    };
    client
        .call::<_, serde_json::Value>(
            Method::PUT,
            &format!("/api/v1/tenants/{}/budget", a.tenant),
            Some(&body),
            &[],
        )
        .await?;
    match a.gpu_hours {
        Some(h) => println!("budget of {}: {h} GPU-unit-hours per month", a.tenant),
        None => println!("budget of {} removed", a.tenant),
    }
    Ok(())
}

pub async fn usage(c: &Common, a: UsageArgs) -> Result<()> {
    let client = Client::new(&c.conn)?;
    if a.by == "interval" {
        return usage_intervals(c, &client, &a).await;
    }
    let mut q = vec![format!("by={}", a.by)];
    for (k, v) in [("tenant", &a.tenant), ("from", &a.from), ("to", &a.to)] {
        if let Some(v) = v {
            q.push(format!("{k}={v}"));
        }
    }
    if c.output == Output::Csv {
        q.push("format=csv".into());
        let csv = client.text(&format!("/api/v1/usage?{}", q.join("&"))).await?;
        print!("{csv}");
        return Ok(());
    }
    let r: UsageReport = client.get(&format!("/api/v1/usage?{}", q.join("&"))).await?;
    if c.output == Output::Json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    print!("{}", usage_text(&r));
    Ok(())
}

/// A usage report for people: unit-hours, and their cost where the server has a price list
/// (without one, the cost columns would read 0.00 for everything, which reads as free).
fn usage_text(r: &UsageReport) -> String {
    let priced = if r.priced {
        r.currency.clone()
    } else {
        "no price list configured: unit-hours only".to_string()
    };
    let row = |u: &UsageRow| {
        let mut v = vec![
            u.key.clone(),
            format!("{:.3}", u.allocated_unit_hours),
            format!("{:.3}", u.measured_unit_hours),
        ];
        if r.priced {
            v.push(format!("{:.2}", u.cost_allocated));
            v.push(format!("{:.2}", u.cost_measured));
        }
        v
    };
    let mut rows: Vec<Vec<String>> = r.rows.iter().map(row).collect();
    rows.push(row(&r.total));
    let by = r.by.to_uppercase();
    let mut head = vec![by.as_str(), "ALLOCATED UNIT-H", "MEASURED UNIT-H"];
    if r.priced {
        head.extend(["COST ALLOCATED", "COST MEASURED"]);
    }
    format!(
        "usage from {} to {} by {} ({priced})\n{}\n",
        r.from,
        r.to,
        r.by,
        table(&head, &rows)
    )
}

/// The declarative file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "a file with `tenants:`, a list of tenants")]
struct Declaration {
    tenants: Vec<DeclTenant>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a tenant such as {name: vision, projects: [train]}"
)]
struct DeclTenant {
    name: String,
    #[serde(default)]
    display_name: Option<String>,
    #[serde(default)]
    projects: Vec<String>,
    /// class → quota
    #[serde(default)]
    quotas: BTreeMap<String, DeclQuota>,
    /// GPU-unit-hours per calendar month.
    #[serde(default)]
    monthly_gpu_hours: Option<f64>,
    /// The registries the tenant's images may come from and the cosign keys one of which must
    /// have signed them (`tessera tenants policy set`); absent: left as it is.
    #[serde(default)]
    image_policy: Option<DeclImagePolicy>,
    /// The priority classes granted to the tenant (`[standard, high]`); absent: left as it is
    /// (a new tenant gets the default grant, standard and opportunistic).
    #[serde(default)]
    priorities: Option<Vec<String>>,
}

#[derive(Deserialize, Clone, PartialEq)]
#[serde(
    deny_unknown_fields,
    expecting = "an image policy such as {registries: [registry.example.com/team/]}"
)]
struct DeclImagePolicy {
    /// Registry/repository prefixes; empty: any registry.
    #[serde(default)]
    registries: Vec<String>,
    /// cosign public keys as PEM text; empty: no signature required.
    #[serde(default)]
    cosign_keys: Vec<String>,
}

#[derive(Deserialize, Clone, Copy, PartialEq)]
#[serde(
    deny_unknown_fields,
    expecting = "a quota in GPU units such as {guaranteed: 8, limit: 16}"
)]
struct DeclQuota {
    guaranteed: f64,
    #[serde(default)]
    limit: Option<f64>,
}

/// Creates or updates tenants, projects, quotas, budgets, image policies and priority grants so
/// that the server matches the file, whole or not at all: the server checks the whole file
/// first (a tenant or project listed twice, unknown pools, models, classes or projects, bad
/// values) and applies it in one transaction (`POST /api/v1/apply`). Quotas of a declared
/// tenant that the file does not list are removed; an image policy or priority grant the file
/// does not give is left as it is. `--dry-run` runs the same checks, lists the changes, and
/// fails as the apply would.
pub async fn apply(c: &Common, a: ApplyArgs) -> Result<()> {
    let text = std::fs::read_to_string(&a.file).with_context(|| format!("cannot read {}", a.file.display()))?;
    let decl: Declaration = serde_yaml_ng::from_str(&text).map_err(|e| {
        let loc = e.location().map(|l| format!(":{}", l.line())).unwrap_or_default();
        anyhow::anyhow!("{}{loc}: {}", a.file.display(), e.to_string().replace('\n', " "))
    })?;
    let body = tessera_api::Declaration {
        tenants: decl
            .tenants
            .into_iter()
            .map(|t| tessera_api::DeclaredTenant {
                name: t.name,
                display_name: t.display_name,
                projects: t.projects,
                quotas: t
                    .quotas
                    .into_iter()
                    .map(|(class, q)| {
                        (
                            class,
                            SetQuota {
                                guaranteed: q.guaranteed,
                                limit: q.limit,
                            },
                        )
                    })
                    .collect(),
                monthly_gpu_hours: t.monthly_gpu_hours,
                image_policy: t.image_policy.map(|p| SetImagePolicy {
                    registries: p.registries,
                    cosign_keys: p.cosign_keys,
                }),
                priorities: t.priorities,
            })
            .collect(),
    };
    // Numbers JSON cannot carry (NaN, infinities) would reach the server as null.
    for t in &body.tenants {
        for (class, q) in &t.quotas {
            for (what, v) in [("guaranteed", Some(q.guaranteed)), ("limit", q.limit)] {
                if let Some(v) = v
                    && !v.is_finite()
                {
                    bail!(
                        "{}: tenant {}: quota {class}: {what} {v} is not a number of GPU units",
                        a.file.display(),
                        t.name
                    );
                }
            }
        }
        if let Some(h) = t.monthly_gpu_hours
            && !h.is_finite()
        {
            bail!(
                "{}: tenant {}: monthly_gpu_hours {h} is not a number of GPU-unit-hours",
                a.file.display(),
                t.name
            );
        }
    }
    let client = Client::new(&c.conn)?;
    let path = format!("/api/v1/apply?dry_run={}", a.dry_run);
    let r: ApplyResult = client
        .post(&path, &body)
        .await
        .map_err(|e| anyhow::anyhow!("{}: {e}", a.file.display()))?;
    if c.output != Output::Table {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    if r.changes.is_empty() {
        println!("no changes: the server matches {}", a.file.display());
    } else {
        for ch in &r.changes {
            println!("{ch}");
        }
        println!(
            "{} change(s) {}",
            r.changes.len(),
            if r.applied {
                "applied"
            } else {
                "would be made (dry run)"
            }
        );
    }
    Ok(())
}

/// `tessera usage --by interval`: the ledger's intervals.
async fn usage_intervals(c: &Common, client: &Client, a: &UsageArgs) -> Result<()> {
    let mut q = Vec::new();
    for (k, v) in [("tenant", &a.tenant), ("from", &a.from), ("to", &a.to)] {
        if let Some(v) = v {
            q.push(format!("{k}={v}"));
        }
    }
    if c.output == Output::Csv {
        q.push("format=csv".into());
        print!(
            "{}",
            client.text(&format!("/api/v1/usage/intervals?{}", q.join("&"))).await?
        );
        return Ok(());
    }
    let r: tessera_api::LedgerExport = client.get(&format!("/api/v1/usage/intervals?{}", q.join("&"))).await?;
    if c.output == Output::Json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    println!(
        "usage ledger from {} to {}: {} intervals",
        r.from,
        r.to,
        r.intervals.len()
    );
    println!(
        "{:>8} {:>3} {:<16} {:<10} {:<14} {:<12} {:>6} {:<24} {:<24}",
        "WORKLOAD", "SEQ", "TENANT/PROJECT", "PRIORITY", "GPU", "POOL", "UNITS", "STARTED", "ENDED"
    );
    for i in &r.intervals {
        println!(
            "{:>8} {:>3} {:<16} {:<10} {:<14} {:<12} {:>6.3} {:<24} {:<24}",
            i.workload,
            i.seq,
            format!("{}/{}", i.tenant, i.project),
            i.priority,
            i.gpu,
            i.pool,
            i.units,
            i.started_at,
            i.ended_at.as_deref().unwrap_or("running")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_shows_costs_only_where_a_price_list_is_configured() {
        let row = |key: &str| UsageRow {
            key: key.into(),
            allocated_unit_hours: 2.0,
            measured_unit_hours: 1.5,
            cost_allocated: 4.8,
            cost_measured: 3.6,
        };
        let report = |priced: bool| UsageReport {
            from: "2026-12-01".into(),
            to: "2026-12-06".into(),
            by: "tenant".into(),
            currency: "EUR".into(),
            priced,
            rows: vec![row("acme")],
            total: row("total"),
        };
        let text = usage_text(&report(false));
        assert!(
            text.starts_with(
                "usage from 2026-12-01 to 2026-12-06 by tenant (no price list configured: unit-hours only)\n"
            ),
            "{text}"
        );
        assert!(!text.contains("COST") && !text.contains("4.80"), "{text}");
        assert!(text.contains("2.000") && text.contains("1.500"), "{text}");
        let text = usage_text(&report(true));
        assert!(
            text.starts_with("usage from 2026-12-01 to 2026-12-06 by tenant (EUR)\n"),
            "{text}"
        );
        assert!(
            text.contains("COST ALLOCATED") && text.contains("4.80") && text.contains("3.60"),
            "{text}"
        );
    }
}
