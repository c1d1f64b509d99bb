//! Why a workload waits, in the words a person reads, and what they can do about it: the
//! scheduler's sentence without its code (the code is shown beside it), as one sentence, with a
//! next step chosen by the reason's stable code; where a waiting workload stands in its
//! tenant's queue (the order the scheduler takes a tenant's jobs in: priority class, then
//! arrival).

use std::collections::HashMap;

use crate::lifecycle::snapshot::Waiting;

/// The code shown for a waiting workload the scheduler has not looked at yet.
pub const NOT_YET: &str = "not-yet-scheduled";

/// A reason's text as one sentence: without the code it may start with (`fragmentation: …`,
/// shown beside the code), capitalised, ending in a full stop.
pub fn sentence(code: &str, detail: &str) -> String {
    let rest = detail
        .strip_prefix(code)
        .and_then(|r| r.strip_prefix(": "))
        .filter(|_| !code.is_empty())
        .unwrap_or(detail)
        .trim();
    if rest.is_empty() {
        return String::new();
    }
    let mut out = String::with_capacity(rest.len() + 1);
    let mut chars = rest.chars();
    if let Some(c) = chars.next() {
        out.extend(c.to_uppercase());
    }
    out.push_str(chars.as_str());
    if !out.ends_with(['.', '!', '?']) {
        out.push('.');
    }
    out
}

/// The pools of `fleet` that cannot serve a multi-node gang of `per_node` GPUs a node-share
/// (`None`: whole nodes) of the GPU `models` (empty: any), each as a sentence: a pool that
/// shares its GPUs (MIG or time-sliced; a gang needs a whole pool, as the scheduler's gang
/// scope has it), a whole pool with no node of an allowed model, and a whole pool none of whose
/// nodes of an allowed model has that many GPUs. Computed from the fleet alone (no placement
/// is searched).
pub fn gang_pools_not_serving(
    fleet: &tessera_model::Fleet,
    per_node: Option<u8>,
    models: &[tessera_model::ModelId],
) -> Vec<String> {
    use tessera_model::Sharing;
    let cat = &fleet.catalogue;
    let names = |ms: &mut dyn Iterator<Item = tessera_model::ModelId>| {
        let mut out: Vec<String> = Vec::new();
        for m in ms {
            let n = cat.get(m).name.clone();
            if !out.contains(&n) {
                out.push(n);
            }
        }
        out.join(", ")
    };
    fleet
        .pools
        .iter()
        .filter_map(|p| {
            if p.sharing != Sharing::Whole {
                let u = tessera_sched::GangUnplaceable::PoolCannotServe {
                    pool: p.name.clone(),
                    sharing: p.sharing,
                };
                return Some(sentence("", &u.message()));
            }
            let nodes = &fleet.nodes[p.nodes.start as usize..p.nodes.end as usize];
            if nodes.is_empty() {
                return Some(sentence("", &format!("pool {} has no nodes", p.name)));
            }
            let allowed: Vec<&tessera_model::Node> = nodes
                .iter()
                .filter(|n| models.is_empty() || models.contains(&n.model))
                .collect();
            if allowed.is_empty() {
                return Some(sentence(
                    "",
                    &format!(
                        "pool {} has no GPU of the allowed models ({}): its nodes have {}",
                        p.name,
                        names(&mut models.iter().copied()),
                        names(&mut nodes.iter().map(|n| n.model))
                    ),
                ));
            }
            let most = allowed.iter().map(|n| n.gpus).max().unwrap_or(0);
            match per_node {
                Some(k) if k > most => Some(sentence(
                    "",
                    &format!(
                        "pool {} cannot serve a node-share of {k} GPUs: its nodes{} have at most {most}",
                        p.name,
                        if models.is_empty() {
                            ""
                        } else {
                            " of the allowed models"
                        }
                    ),
                )),
                None if most == 0 => Some(sentence("", &format!("pool {} has no GPUs", p.name))),
                _ => None,
            }
        })
        .collect()
}

/// A short label for a reason code, for counts and filters ("over quota").
pub fn label(code: &str) -> &'static str {
    match code {
        "no-capacity" => "no free capacity",
        "fragmentation" => "capacity is fragmented",
        "isolation" => "would share a GPU with another tenant",
        "held" => "capacity held for another request",
        "quota" => "over quota",
        "budget" => "over budget",
        "backoff" => "preempted recently",
        "preemption" => "waiting for preempted work to stop",
        "not-considered" => "not considered yet",
        "constraint" => "no node can hold it",
        NOT_YET => "not scheduled yet",
        _ => "other",
    }
}

/// What the reader can do about a reason of `code`. `admin`: the reader is a platform admin
/// (who raises quotas and budgets themselves); `now`: ms since the epoch (a budget renews at
/// the start of next month).
pub fn next_step(code: &str, admin: bool, now: i64) -> String {
    match code {
        "no-capacity" => "Next: wait for running work to end, pick another pool, or ask for fewer GPUs.".into(),
        "fragmentation" => {
            "Next: ask for fewer GPUs (a smaller shape fits on more nodes), pick another pool, or wait for work on a node to end.".into()
        }
        "isolation" => "Next: wait for a GPU no other tenant uses, or pick another pool.".into(),
        "held" => "Next: wait; that capacity is held for a request that has waited longer. Or pick another pool.".into(),
        "quota" if admin => "Next: raise the tenant's quota on the Tenants page, or shrink the request.".into(),
        "quota" => "Next: ask your platform admin to raise your tenant's quota, shrink the request, or wait for your tenant's running work to end.".into(),
        "budget" if admin => format!(
            "Next: raise the tenant's monthly budget on the Tenants page, or wait until it renews on {}.",
            month_start_after(now)
        ),
        "budget" => format!(
            "Next: ask your platform admin to raise the monthly budget, or wait until it renews on {}.",
            month_start_after(now)
        ),
        "backoff" => "Next: wait until it may borrow again, or shrink the request to fit within the guaranteed share.".into(),
        "preemption" => "Next: nothing to do; it starts once the preempted work has stopped.".into(),
        "not-considered" => "Next: nothing to do; a later scheduler cycle looks at it.".into(),
        NOT_YET => "Next: nothing to do; the scheduler looks at it within seconds.".into(),
        "constraint" => "Next: change the request; no node can ever hold it as asked.".into(),
        _ => String::new(),
    }
}

/// The first instant of the month after `now`, `YYYY-MM-01 00:00 UTC`.
fn month_start_after(now: i64) -> String {
    let d = tessera_sched::reason::utc_datetime(now);
    let y: i64 = d.get(..4).and_then(|x| x.parse().ok()).unwrap_or(1970);
    let m: u32 = d.get(5..7).and_then(|x| x.parse().ok()).unwrap_or(1);
    let (y, m) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
    format!("{y:04}-{m:02}-01 00:00 UTC")
}

/// `n` as an ordinal: `1st`, `2nd`, `3rd`, `11th`, `22nd`.
pub fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

/// Each waiting workload's place in its tenant's queue, `(position from 1, how many of the
/// tenant wait)`, for the tenants `want` accepts: a tenant's jobs are taken by priority class
/// (`ranks`: the configured classes, most important first), then oldest first.
pub fn positions(all: &[Waiting], ranks: &[String], want: impl Fn(&str) -> bool) -> HashMap<u64, (usize, usize)> {
    let rank = |p: &str| ranks.iter().position(|r| r == p).unwrap_or(ranks.len());
    let mut by_tenant: HashMap<&str, Vec<(usize, i64, u64)>> = HashMap::new();
    for w in all {
        let w = &*w.workload;
        if want(&w.spec.tenant) {
            by_tenant
                .entry(&w.spec.tenant)
                .or_default()
                .push((rank(&w.spec.priority), w.created_at, w.id.0));
        }
    }
    let mut out = HashMap::new();
    for (_, mut jobs) in by_tenant {
        jobs.sort_unstable();
        let n = jobs.len();
        for (i, (_, _, id)) in jobs.into_iter().enumerate() {
            out.insert(id, (i + 1, n));
        }
    }
    out
}

/// "3rd of 7 waiting in tenant vision's queue".
pub fn position_words(tenant: &str, (pos, of): (usize, usize)) -> String {
    if of == 1 {
        format!("the only workload waiting in tenant {tenant}'s queue")
    } else {
        format!("{} of {of} waiting in tenant {tenant}'s queue", ordinal(pos))
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn pools_that_cannot_serve_a_gang_are_named_with_why() {
        let seed = tessera_model::Fleet::seed();
        let all = gang_pools_not_serving(&seed, Some(8), &[]);
        assert_eq!(all.len(), 2, "{all:?}");
        assert!(
            all.iter()
                .any(|x| x.starts_with("Pool serving shares its GPUs by mig; a multi-node gang needs a whole pool")),
            "{all:?}"
        );
        assert!(
            all.iter()
                .any(|x| x.starts_with("Pool development shares its GPUs by shared")),
            "{all:?}"
        );
        assert!(!all.iter().any(|x| x.contains("training")), "{all:?}");
        // A node-share larger than any node of the whole pool: that pool cannot serve it either.
        let big = gang_pools_not_serving(&seed, Some(16), &[]);
        assert!(
            big.iter()
                .any(|x| x == "Pool training cannot serve a node-share of 16 GPUs: its nodes have at most 8."),
            "{big:?}"
        );
        assert_eq!(gang_pools_not_serving(&seed, None, &[]).len(), 2);
    }

    #[test]
    fn a_whole_pool_without_the_allowed_models_cannot_serve_a_gang() {
        let fleet = tessera_model::Fleet::from_toml(
            "[[pool]]\nname = \"hopper\"\nsharing = \"whole\"\n[[pool.nodes]]\nname = \"h\"\ncount = 2\ngpu_model = \"H100-80GB-SXM\"\ngpus = 8\ncpus = 112\nmemory_gib = 1024\n\
             [[pool]]\nname = \"ampere\"\nsharing = \"whole\"\n[[pool.nodes]]\nname = \"a\"\ncount = 2\ngpu_model = \"A100-80GB\"\ngpus = 8\ncpus = 128\nmemory_gib = 1024\n\
             [[pool.nodes]]\nname = \"a4\"\ngpu_model = \"A100-80GB\"\ngpus = 4\ncpus = 64\nmemory_gib = 512\n",
            "two-whole-pools",
        )
        .unwrap();
        let h100 = fleet.catalogue.find("H100-80GB-SXM").unwrap();
        let a100 = fleet.catalogue.find("A100-80GB").unwrap();
        // Any model: both whole pools serve a gang of 8-GPU node-shares.
        assert_eq!(gang_pools_not_serving(&fleet, Some(8), &[]), Vec::<String>::new());
        // Only H100s: the A100 pool cannot, and says which models it has.
        assert_eq!(
            gang_pools_not_serving(&fleet, Some(8), &[h100]),
            ["Pool ampere has no GPU of the allowed models (H100-80GB-SXM): its nodes have A100-80GB."]
        );
        assert_eq!(
            gang_pools_not_serving(&fleet, None, &[a100]),
            ["Pool hopper has no GPU of the allowed models (A100-80GB): its nodes have H100-80GB-SXM."]
        );
        // Both models allowed: the pools are judged by their nodes of those models only.
        assert_eq!(
            gang_pools_not_serving(&fleet, Some(8), &[h100, a100]),
            Vec::<String>::new()
        );
        assert_eq!(
            gang_pools_not_serving(&fleet, Some(16), &[a100]),
            [
                "Pool hopper has no GPU of the allowed models (A100-80GB): its nodes have H100-80GB-SXM.",
                "Pool ampere cannot serve a node-share of 16 GPUs: its nodes of the allowed models have at most 8.",
            ]
        );
    }

    use super::*;

    #[test]
    fn a_reason_reads_as_one_sentence_without_its_code() {
        assert_eq!(
            sentence("fragmentation", "fragmentation: 12 GPU units are free in pool training"),
            "12 GPU units are free in pool training."
        );
        assert_eq!(sentence("quota", "tenant vision holds 8"), "Tenant vision holds 8.");
        assert_eq!(sentence("held", ""), "");
        assert_eq!(sentence("", ": x"), ": x.");
    }

    #[test]
    fn every_waiting_code_has_a_next_step() {
        for code in [
            "no-capacity",
            "fragmentation",
            "isolation",
            "held",
            "quota",
            "budget",
            "backoff",
            "preemption",
            "not-considered",
            "constraint",
            NOT_YET,
        ] {
            assert!(next_step(code, false, 0).starts_with("Next: "), "{code}");
            assert_ne!(label(code), "other", "{code}");
        }
        assert!(next_step("quota", false, 0).contains("ask your platform admin"));
        assert!(next_step("quota", true, 0).contains("Tenants page"));
        // 2026-12-04 14:20 UTC: the budget renews on the first of January.
        assert!(next_step("budget", false, 1_796_394_000_000).contains("2027-01-01 00:00 UTC"));
        assert!(next_step("budget", false, 0).contains("1970-02-01 00:00 UTC"));
    }

    #[test]
    fn ordinals() {
        let got: Vec<String> = [1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111].map(ordinal).into();
        assert_eq!(
            got,
            [
                "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th"
            ]
        );
    }

    #[test]
    fn a_tenants_queue_is_by_priority_then_arrival() {
        use tessera_domain::Phase;
        let w = |id: u64, tenant: &str, prio: &str, at: i64| {
            let mut w = tessera_store::conformance::workload(id, tenant, "p", Phase::Queued);
            w.spec.priority = prio.into();
            w.created_at = at;
            Waiting {
                workload: w.into(),
                class: "any".into(),
            }
        };
        let all = [
            w(1, "vision", "normal", 10),
            w(2, "nlp", "normal", 11),
            w(3, "vision", "high", 12),
            w(4, "vision", "normal", 13),
        ];
        let ranks = ["high".to_string(), "normal".to_string()];
        let p = positions(&all, &ranks, |t| t == "vision");
        assert_eq!(p[&3], (1, 3), "high first though it came later");
        assert_eq!(p[&1], (2, 3));
        assert_eq!(p[&4], (3, 3));
        assert!(!p.contains_key(&2), "another tenant's work is not counted");
        assert_eq!(
            position_words("vision", p[&1]),
            "2nd of 3 waiting in tenant vision's queue"
        );
        assert_eq!(
            position_words("nlp", (1, 1)),
            "the only workload waiting in tenant nlp's queue"
        );
    }
}
