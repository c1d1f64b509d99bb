//! The dry run of a workload request (`POST /api/v1/workloads/dry-run`): the same body and the
//! same checks as creation, then — on the lifecycle's published snapshot, changing nothing —
//! what it would cost, how it would count against the tenant's quotas (the scheduler's own
//! quota check, [`check_quotas`]) and budget, and where it would be placed now — asked of the
//! scheduler's placement engine itself (`plan` on the copy the snapshot carries), so "start",
//! "borrow" or "wait" with the engine's typed reason (`fragmentation`, `no-capacity`,
//! `isolation`) is what a submission would get. A gang that would wait is told where and when
//! it starts (the hold the scheduler would give it), or, where it would take capacity back
//! within its guarantee or by its priority, when — the loop's scheduler is asked, so the words
//! are those its queue reason will give. The console's request form shows this before anything
//! is submitted; `tessera run --dry-run` prints it.

use axum::Json;
use axum::extract::State;
use tessera_api::{CreateWorkload, DryRun, DryRunBudget, DryRunQuota};
use tessera_model::{Fleet, GpuUnits, PoolId, Request, Shape, Sharing};
use tessera_sched::Unplaceable;
use tessera_sched::cycle::{Admission, Quota, check_quotas, project_key};
use tessera_sched::reason::Wait;

use super::ApiJson;
use crate::auth::Identity;
use crate::lifecycle::{Forecast, Snapshot, TenantSnap, Trial};
use crate::problem::ApiResult;
use crate::services::workloads::{Checked, check_create, expected_start_words};
use crate::state::AppState;

/// What a request would do if made now: cost in GPU units and money, quotas and budget before
/// and after, and whether it would start, borrow, wait or be refused (with the typed reason).
/// Nothing is created or changed.
#[utoipa::path(post, path = "/api/v1/workloads/dry-run", tag = "workloads", request_body = CreateWorkload,
    responses((status = 200, body = DryRun),
        (status = 403, description = "A viewer token, a tenant the caller may not write, or an image the tenant's image policy refuses", body = tessera_api::Problem),
        (status = 422, description = "A value breaks a rule, names an unknown tenant, project or priority class, or asks for a shape no node can ever hold", body = tessera_api::Problem),
        (status = 503, description = "The tenant's image policy needs the image's registry, which could not be asked", body = tessera_api::Problem)))]
pub async fn dry_run(
    State(s): State<AppState>,
    id: Identity,
    ApiJson(b): ApiJson<CreateWorkload>,
) -> ApiResult<Json<DryRun>> {
    let c = check_create(&s, &id, &b).await?;
    Ok(Json(answer(&s, &b, &c).await))
}

/// The dry run's answer to checked request `c` now, as the API and the console give it: on
/// an engine and holds at least as new as the records a caller has read, and, for a gang
/// that would wait, with when it would take capacity from running work (the loop is asked, as
/// the scheduler's own forecast: [`Lifecycle::gang_forecast`](crate::lifecycle::Lifecycle::gang_forecast)).
pub(crate) async fn answer(s: &AppState, b: &CreateWorkload, c: &Checked) -> DryRun {
    let snap = s.lifecycle.trial_snapshot().await;
    preview(s, &snap, b, c, true).await
}

/// The forecast for gang `g` of checked request `c`, asked of the loop as if it were
/// submitted now.
async fn gang_forecast(
    s: &AppState,
    b: &CreateWorkload,
    c: &Checked,
    g: &tessera_model::request::GangRequest,
) -> Forecast {
    let mut job = tessera_sched::cycle::Job::new(
        // No workload has this id: every hold and running workload is someone else's.
        u64::MAX,
        &b.tenant,
        &b.project,
        c.request.clone(),
        &c.priority,
        crate::clock::now_ms(),
    );
    job.gang = Some(g.clone());
    job.duration_ms = b.duration_s.map(|d| d.saturating_mul(1000));
    s.lifecycle.gang_forecast(job).await
}

/// The pools a request may use: its pool if it names one, else those whose sharing mode serves
/// its shape and that have a node of an allowed model.
fn scope(f: &Fleet, r: &Request) -> Vec<PoolId> {
    (0..f.pools.len())
        .map(|i| PoolId(i as u16))
        .filter(|&p| r.pool.is_none_or(|x| x == p))
        .filter(|&p| {
            let pool = f.pool(p);
            let sharing = match &r.shape {
                Shape::Whole { .. } => matches!(pool.sharing, Sharing::Whole | Sharing::Shared),
                Shape::Mig(_) => pool.sharing == Sharing::Mig,
                Shape::Fraction { .. } => pool.sharing == Sharing::Shared,
                Shape::CpuOnly => true,
            };
            // A gang of whole GPUs needs one node with that many.
            let size = |n: &tessera_model::Node| match r.shape {
                Shape::Whole { gpus } => n.gpus >= gpus,
                _ => true,
            };
            sharing
                && f.nodes[pool.nodes.start as usize..pool.nodes.end as usize]
                    .iter()
                    .any(|n| model_ok(r, n.model) && size(n))
        })
        .collect()
}

fn model_ok(r: &Request, m: tessera_model::ModelId) -> bool {
    let listed = r.models.is_empty() || r.models.contains(&m);
    match &r.shape {
        Shape::Mig(c) => listed && c.options.iter().any(|(om, _)| *om == m),
        _ => listed,
    }
}

/// Where the scheduler's engine would place `r` now, in the first of `pools` (those within the
/// tenant's limits, in the engine's order) that holds it: `(pool, node)`; or the engine's
/// typed reason why none does. Asked of the engine copy the snapshot carries, so the answer is
/// the one a submission would get from the same state (requests queued ahead may still take
/// the capacity first).
fn place(
    trial: &Trial,
    f: &Fleet,
    r: &Request,
    tenant: &str,
    pools: &[PoolId],
) -> Result<(PoolId, String), Unplaceable> {
    let mut first_err = None;
    for &p in pools {
        let mut one = r.clone();
        one.pool = Some(p);
        match trial.plan(&one, tenant) {
            Ok(pl) => return Ok((p, f.node(pl.node).name.clone())),
            Err(u) => {
                first_err.get_or_insert(u);
            }
        }
    }
    match first_err {
        Some(u) => Err(u),
        None => trial
            .plan(r, tenant)
            .map(|pl| (f.node(pl.node).pool, f.node(pl.node).name.clone())),
    }
}

/// Where the engine would place gang `g` now, in the first pool within the tenant's limits
/// that holds it whole: the pool and its node-shares (`NODE×G` by rack); or why not.
fn place_gang(
    trial: &Trial,
    g: &tessera_model::request::GangRequest,
    admitted: &[(PoolId, Admission)],
) -> Result<(PoolId, String), tessera_sched::GangUnplaceable> {
    let mut first_err = None;
    for (p, _) in admitted {
        let mut one = g.clone();
        one.pool = Some(*p);
        match trial.plan_gang(&one) {
            Ok(pl) => {
                let racks: Vec<String> = pl.racks.iter().map(|(r, n)| format!("{r} ({n} nodes)")).collect();
                return Ok((*p, format!("{} node-shares in {}", pl.shares.len(), racks.join(", "))));
            }
            Err(u) => {
                first_err.get_or_insert(u);
            }
        }
    }
    Err(first_err.unwrap_or(tessera_sched::GangUnplaceable::NoPoolServes))
}

/// The dry run's answer on a snapshot. With `forecast`, a gang that cannot start now and may
/// wait asks the loop whether and when it would take capacity from running work (then its
/// reason says that, as the queue's will, instead of the later start when running work ends;
/// when not known, neither); without, it names no start.
pub(crate) async fn preview(s: &AppState, snap: &Snapshot, b: &CreateWorkload, c: &Checked, forecast: bool) -> DryRun {
    let f = &snap.fleet;
    let units = c
        .gang
        .as_ref()
        .map_or_else(|| c.request.units(&f.catalogue), |g| g.units());
    let empty = TenantSnap::default();
    let t = snap.tenants.get(&b.tenant).unwrap_or(&empty);
    let quota = |k: &str| t.quotas.iter().find(|(c, _, _)| c == k).map(|(_, q, _)| *q);
    let held = |k: &str| {
        t.quotas
            .iter()
            .find(|(c, _, _)| c == k)
            .map(|(_, _, h)| *h)
            .unwrap_or_default()
    };
    let project = project_key(&b.project);
    let pools = match (&c.gang, &snap.trial) {
        (Some(g), Some(trial)) => trial.gang_pools(g),
        (Some(_), None) => Vec::new(),
        (None, _) => scope(f, &c.request),
    };
    let unit_hours = b.duration_s.map(|d| units.as_f64() * d as f64 / 3600.0);
    let budget = t.budget.map(|(budget, spent)| DryRunBudget {
        budget,
        spent,
        left: budget - spent,
        running: t.running_unit_hours,
        left_after: unit_hours.map(|h| budget - spent - t.running_unit_hours - h),
    });
    // The admit action's order: the budget, then each pool's quota (the pool and the
    // project's sub-quota), then free capacity in a pool that is within its limits.
    let mut admitted: Vec<(PoolId, Admission)> = Vec::new();
    let mut over = None;
    for &p in &pools {
        let keys = [f.pool(p).name.as_str(), project.as_str()];
        match check_quotas(&b.tenant, &keys, units, quota, held) {
            Ok(a) => admitted.push((p, a)),
            Err(e) => {
                over.get_or_insert(e);
            }
        }
    }
    let waits_or_refuses = if b.no_wait { "refused" } else { "wait" };
    let spent_out = t.budget.filter(|(budget, spent)| spent >= budget);
    let (outcome, code, reason, pool, node) = if pools.is_empty() {
        (
            "refused",
            Some("constraint"),
            Some("no pool of this fleet can ever hold this shape".to_string()),
            None,
            None,
        )
    } else if let Some((budget, spent)) = spent_out {
        (
            waits_or_refuses,
            Some("budget"),
            Some(
                tessera_sched::reason::BudgetExceeded {
                    tenant: b.tenant.clone(),
                    spent,
                    budget,
                }
                .to_string(),
            ),
            None,
            None,
        )
    } else if admitted.is_empty() {
        let e = over.expect("every pool is over a limit");
        (waits_or_refuses, Some("quota"), Some(e.to_string()), None, None)
    } else {
        let placed = match &snap.trial {
            Some(trial) if c.gang.is_some() => {
                let g = c.gang.as_ref().expect("a gang");
                match place_gang(trial, g, &admitted) {
                    Ok(placed) => Ok(placed),
                    Err(u) if u.is_constraint() => Err(("refused", u.code(), u.to_string())),
                    Err(u) if b.no_wait => Err((waits_or_refuses, u.code(), u.to_string())),
                    Err(u) => {
                        let asked = if forecast {
                            gang_forecast(s, b, c, g).await
                        } else {
                            Forecast::Unknown
                        };
                        let mut why = u.to_string();
                        match asked {
                            Forecast::Takes(f) => {
                                why = Wait::PreemptsIn {
                                    now: Box::new(Wait::Gang(u.clone())),
                                    cause: f.cause,
                                    at_ms: f.at_ms,
                                    in_s: (f.in_ms.max(0) + 999) / 1000,
                                }
                                .to_string();
                            }
                            Forecast::Never => {
                                let duration_ms = b.duration_s.map(|d| d.saturating_mul(1000));
                                if let Some(start) = trial.gang_start(g, duration_ms, crate::clock::now_ms()) {
                                    why.push_str("; ");
                                    why.push_str(&expected_start_words(&start));
                                }
                            }
                            Forecast::Unknown => {}
                        }
                        Err((waits_or_refuses, u.code(), why))
                    }
                }
            }
            Some(trial) => {
                // The pools within the tenant's limits, in the engine's own order.
                let within: Vec<PoolId> = trial
                    .scope(&c.request)
                    .into_iter()
                    .filter(|p| admitted.iter().any(|(q, _)| q == p))
                    .collect();
                place(trial, f, &c.request, &b.tenant, &within).map_err(|u| {
                    let code = if u.is_constraint() { "refused" } else { waits_or_refuses };
                    (code, u.code(), u.to_string())
                })
            }
            None => Err((
                waits_or_refuses,
                "no-capacity",
                "the scheduler has not published its state yet".to_string(),
            )),
        };
        match placed {
            Ok((p, node)) => {
                let borrowing = admitted.iter().any(|(q, a)| *q == p && a.borrowing());
                (
                    if borrowing { "borrow" } else { "start" },
                    None,
                    None,
                    Some(f.pool(p).name.clone()),
                    Some(node),
                )
            }
            Err((outcome, code, why)) => (outcome, Some(code), Some(why), None, None),
        }
    };
    let at = pool
        .as_deref()
        .or_else(|| pools.first().map(|&p| f.pool(p).name.as_str()));
    let model = c
        .request
        .models
        .first()
        .map(|&m| f.catalogue.get(m).name.clone())
        .or_else(|| match &c.request.shape {
            Shape::Mig(ch) => ch.options.first().map(|(m, _)| f.catalogue.get(*m).name.clone()),
            _ => None,
        })
        .unwrap_or_default();
    let price = at.map(|p| s.prices.price(p, &model)).unwrap_or(0.0);
    let classes: Vec<String> = match at {
        Some(p) => vec![p.to_string(), project.clone()],
        None => vec![project.clone()],
    };
    let quotas = classes
        .iter()
        .filter_map(|k| {
            let q: Quota = quota(k)?;
            let used = held(k);
            Some(DryRunQuota {
                class: k.clone(),
                guaranteed: q.guaranteed.as_f64(),
                limit: q.limit.map(GpuUnits::as_f64),
                used: used.as_f64(),
                after: (used + units).as_f64(),
            })
        })
        .collect();
    DryRun {
        outcome: outcome.into(),
        reason_code: code.map(str::to_string),
        reason,
        pool,
        node,
        units: units.to_string(),
        unit_hours,
        price_per_unit_hour: price,
        cost: unit_hours.map(|h| h * price),
        currency: s.prices.currency.clone(),
        priced: s.prices.configured(),
        quotas,
        budget,
    }
}
