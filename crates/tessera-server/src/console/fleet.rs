//! The fleet map: pools → nodes → GPUs → MIG slices and fractions, coloured by tenant, with
//! health and cordon/drain state. Platform-admins see every tenant; a tenant's users see where
//! their own tenant's work runs — the nodes holding it, their tenant's cells in its colour,
//! every other tenant's share as an unnamed "another tenant" cell (never a name or workload id,
//! as the REST API's GPU list) — and no node operations. It stays usable at 10,000 GPUs by aggregating: pool
//! totals, then one row per node (filtered by pool, state and tenant, 100 per page) with a cell
//! per GPU, grouped under a heading per rack with the rack's free and total GPUs (and the rack's
//! block, where the fleet declares blocks: nodes are ordered by pool, block, rack); a
//! multi-node gang's cells are outlined and name it on every node it spans (found in one pass
//! over the GPUs, never a lookup per cell); a node's GPU-level detail (each MIG slice and fraction with its workload) is
//! fetched on demand when the node is opened. Everything is read from the published snapshot.

use std::collections::{BTreeMap, HashMap};

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::response::Response;
use serde::Deserialize;
use tessera_api::GpuView;
use tessera_store::NodeState;

use super::{Caller, Chrome, html};
use crate::http::views;
use crate::lifecycle::{NodeOp, Telemetry};
use crate::problem::ApiError;
use crate::state::AppState;

/// How many tenant colours there are (`t0`…`t15` in the stylesheet, each with a text colour of
/// enough contrast for the tenant's key letter); `t16` is free capacity.
pub const PALETTE: u8 = 16;
/// The colour class of free capacity.
pub const FREE: u8 = PALETTE;
/// The colour class of another tenant's share on a tenant user's map (no name, no key).
pub const OTHER: u8 = PALETTE + 1;

/// The tenant whose work a caller's map shows: `None` for platform-admins (every tenant);
/// a tenant user's own tenant; refused for a non-admin without a tenant.
fn map_scope(id: &crate::auth::Identity) -> Result<Option<String>, ApiError> {
    if id.is_admin() {
        return Ok(None);
    }
    match &id.tenant {
        Some(t) if !t.is_empty() => Ok(Some(t.clone())),
        _ => id.require_admin().map(|_| None),
    }
}

/// What a GPU's label says of its holders: `tenant #workload` for those the caller may read,
/// `another tenant` (once) for the others.
fn holders_words(holders: &[crate::lifecycle::HolderSnap], id: &crate::auth::Identity) -> String {
    let mut who: Vec<String> = Vec::new();
    for h in holders {
        let w = if id.can_read(&h.tenant) {
            format!("{} #{}", h.tenant, h.workload)
        } else {
            "another tenant".to_string()
        };
        if !who.contains(&w) {
            who.push(w);
        }
    }
    who.join(", ")
}

/// FNV-1a of a tenant's name: stable across builds and restarts (std's hasher is not).
fn fnv(tenant: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in tenant.bytes() {
        h ^= b as u32;
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// A tenant's preferred colour: a stable hash of its name (the palette below resolves
/// collisions between the tenants shown together).
pub fn colour(tenant: &str) -> u8 {
    if tenant.is_empty() {
        return FREE;
    }
    (fnv(tenant) % PALETTE as u32) as u8
}

/// How many fill patterns there are (`p0`, solid, … `p5` in the stylesheet): the 17th to 32nd
/// tenants take the palette again with diagonal hatching, the next 16 with horizontal stripes,
/// and so on, so up to 96 tenants differ by colour and pattern together.
pub const PATTERNS: u8 = 6;

/// A tenant's swatch on the map: a colour, a fill pattern (solid for the first 16 tenants) and
/// a key letter (`A`, `B`, …, `Z`, `AA`, …) drawn in its cells and legend, so colour is never
/// the only signal and two tenants never look the same.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Swatch {
    pub colour: u8,
    pub pattern: u8,
    pub key: String,
}

impl Swatch {
    /// The swatch's classes: `t3` (the colour), with `p2` (the pattern) where it has one.
    pub fn classes(&self) -> String {
        classes(self.colour, self.pattern)
    }
}

/// The classes of a colour and pattern: `t3`, or `t3 p2` where the pattern is not solid.
pub fn classes(colour: u8, pattern: u8) -> String {
    if pattern == 0 {
        format!("t{colour}")
    } else {
        format!("t{colour} p{pattern}")
    }
}

/// The key of the `i`-th tenant in name order: `A`…`Z`, then `AA`, `AB`, …
fn key(i: usize) -> String {
    let letter = |n: usize| char::from(b'A' + (n % 26) as u8);
    if i < 26 {
        letter(i).to_string()
    } else {
        format!("{}{}", letter(i / 26 - 1), letter(i))
    }
}

/// Swatches for the tenants with work on the fleet: in name order, each takes its preferred
/// colour, or the next one no tenant of its round took; the first 16 tenants are the first
/// round (solid), the next 16 the second (hatched), and so on. So up to 16 tenants get 16
/// distinct colours, up to 96 distinct colour-and-pattern pairs, and a tenant keeps its swatch
/// while the set of tenants with work stays the same (whatever page or filter is shown). The
/// key letters are distinct however many tenants there are.
pub fn palette<'a>(tenants: impl IntoIterator<Item = &'a str>) -> BTreeMap<String, Swatch> {
    let names: std::collections::BTreeSet<&str> = tenants.into_iter().filter(|t| !t.is_empty()).collect();
    let mut taken = [false; PALETTE as usize];
    let mut out = BTreeMap::new();
    for (i, t) in names.into_iter().enumerate() {
        if i % PALETTE as usize == 0 {
            taken = [false; PALETTE as usize];
        }
        let want = colour(t);
        let c = (0..PALETTE)
            .map(|d| (want + d) % PALETTE)
            .find(|&c| !taken[c as usize])
            .unwrap_or(want);
        taken[c as usize] = true;
        let pattern = ((i / PALETTE as usize) % PATTERNS as usize) as u8;
        out.insert(
            t.to_string(),
            Swatch {
                colour: c,
                pattern,
                key: key(i),
            },
        );
    }
    out
}

/// The swatches of every tenant holding a GPU share anywhere in the snapshot (one pass), or
/// of the one tenant a tenant user's map shows (`scope`).
fn fleet_palette(snap: &crate::lifecycle::Snapshot, scope: Option<&str>) -> BTreeMap<String, Swatch> {
    palette(
        snap.nodes
            .iter()
            .flat_map(|n| n.gpus.iter())
            .flat_map(|g| g.holders.iter())
            .map(|h| h.tenant.as_str())
            .filter(|t| scope.is_none_or(|s| s == *t)),
    )
}

/// A GPU cell of a node row: who holds it (the tenant of its largest share) and how much.
pub struct Cell {
    pub index: usize,
    pub colour: u8,
    /// The holding tenant's fill pattern (0: solid).
    pub pattern: u8,
    /// The holding tenant's key letter (empty when free).
    pub key: String,
    /// Dimmed: another tenant's while one is highlighted.
    pub dim: bool,
    pub label: String,
    /// `free`, `part` or `full`.
    pub fill: &'static str,
    /// Out of placement because it failed (shown with a mark and in the label).
    pub unhealthy: bool,
    /// Held by a multi-node gang (its workload id): the cell is outlined and says so.
    pub gang: Option<u64>,
}

/// What a person reads about a failed GPU: the XID or the cause, and what happened.
pub fn health_words(r: &tessera_store::GpuHealthRecord) -> String {
    match r.xid {
        Some(x) => format!("unhealthy: XID {x} ({})", r.detail),
        None => format!("unhealthy: {}", r.detail),
    }
}

/// The mark shown beside a node state that is not `ready` (the word follows it).
pub fn state_mark(state: &str) -> &'static str {
    match NodeState::parse(state) {
        Some(NodeState::Ready) => "",
        Some(NodeState::Draining) => "⇥",
        Some(NodeState::Maintenance) => "⚒",
        Some(NodeState::Cordoned) | None => "⏸",
    }
}

pub struct NodeRow {
    pub name: String,
    pub pool: String,
    pub model: String,
    pub state: String,
    pub used: String,
    pub free: usize,
    /// Failed GPUs of the node.
    pub unhealthy: usize,
    pub cells: Vec<Cell>,
    /// The multi-node gangs holding GPUs of the node: `(workload, nodes it spans)`.
    pub gangs: Vec<(u64, usize)>,
}

/// The node rows of one rack (or of a pool without racks), with the rack's free and total
/// GPUs over all its nodes (not only those shown).
pub struct RackGroup {
    /// The rack's name; `None` for nodes whose pool declares no racks.
    pub rack: Option<String>,
    /// The block (spine) the rack lies in, where the fleet declares blocks.
    pub block: Option<String>,
    pub pool: String,
    pub free: usize,
    pub total: usize,
    pub rows: Vec<NodeRow>,
}

/// One rack of the whole-fleet heat map (or a pool's nodes where it declares no racks): every
/// GPU as a character, drawn as a small cell by the console's script — `0` free, `1` partly
/// used, `2` full, `x` failed, `h` held by the highlighted tenant — nodes separated by `,`.
pub struct HeatGroup {
    pub pool: String,
    /// The block (spine) of the group's nodes, where the fleet declares blocks.
    pub block: Option<String>,
    pub rack: Option<String>,
    pub free: usize,
    pub total: usize,
    /// The nodes' names, `,`-separated, in the order of `cells`.
    pub nodes: String,
    pub cells: String,
}

pub struct PoolRow {
    pub name: String,
    pub sharing: String,
    pub nodes: u64,
    pub gpus: u64,
    pub used: String,
    pub total: String,
    pub not_ready: usize,
    pub unhealthy: usize,
}

#[derive(Deserialize, Default)]
pub struct FleetQuery {
    #[serde(default)]
    pub pool: String,
    #[serde(default)]
    pub state: String,
    #[serde(default)]
    pub tenant: String,
    /// `unhealthy`: only nodes with a failed GPU.
    #[serde(default)]
    pub health: String,
    /// Only the nodes of this rack.
    #[serde(default)]
    pub rack: String,
    /// Only nodes whose name contains this.
    #[serde(default)]
    pub node: String,
    /// Only the nodes holding a share of this workload (its id, `#` optional).
    #[serde(default)]
    pub workload: String,
    /// `free`: most free GPUs first (no rack headings); otherwise pool and rack order.
    #[serde(default)]
    pub sort: String,
    /// Highlight this tenant's cells (the others are dimmed); the colours stay as they are.
    #[serde(default)]
    pub highlight: String,
    #[serde(default)]
    pub page: usize,
}

/// A legend entry: a tenant's swatch and the link that highlights it (or, when it is
/// highlighted, the link that ends the highlight).
pub struct LegendEntry {
    pub tenant: String,
    pub colour: u8,
    pub pattern: u8,
    pub key: String,
    pub highlighted: bool,
    pub href: String,
}

#[derive(Template)]
#[template(path = "console/fleet.html")]
struct FleetPage {
    chrome: Chrome,
    /// A tenant user's own tenant (their map shows only its work); `None` for platform-admins.
    scope: Option<String>,
    /// The tenants with work on the fleet, for the tenant filter's choices (admins).
    tenant_names: Vec<String>,
    /// Every rack's name, for the rack filter's choices.
    rack_names: Vec<String>,
    pools: Vec<PoolRow>,
    heat: Vec<HeatGroup>,
    /// Whether the fleet declares blocks (the heat map's groups then name theirs).
    has_blocks: bool,
    /// Where a heat map node's cells lead: the node search (keeping the highlight), its name appended.
    heat_href: String,
    groups: Vec<RackGroup>,
    /// Whether any row shown stands under a rack heading.
    by_rack: bool,
    shown: usize,
    legend: Vec<LegendEntry>,
    /// The highlighted tenant, where it has work on the fleet.
    highlight: Option<String>,
    q: FleetQuery,
    pool_names: Vec<String>,
    matched: usize,
    first: usize,
    next: Option<String>,
    prev: Option<String>,
}

impl FleetPage {
    fn mark(&self, state: &str) -> &'static str {
        state_mark(state)
    }
}

const PER_PAGE: usize = 100;

/// `GET /console/fleet`: pool totals and the filtered node rows; a tenant user's map shows
/// the nodes holding their own tenant's work, highlighted, and names no other tenant.
pub async fn fleet(
    State(s): State<AppState>,
    c: Caller,
    Query(mut q): Query<FleetQuery>,
) -> Result<Response, ApiError> {
    let scope = map_scope(&c.id)?;
    if let Some(t) = &scope {
        q.tenant = t.clone();
        q.highlight = t.clone();
    }
    if !q.state.is_empty() && NodeState::parse(&q.state).is_none() {
        return Err(ApiError::invalid(
            "state",
            format!(
                "unknown node state `{}` ({})",
                q.state,
                NodeState::ALL.map(NodeState::as_str).join(", ")
            ),
        ));
    }
    if !q.health.is_empty() && q.health != "unhealthy" {
        return Err(ApiError::invalid(
            "health",
            format!("unknown health filter `{}` (unhealthy)", q.health),
        ));
    }
    if !q.sort.is_empty() && q.sort != "free" {
        return Err(ApiError::invalid("sort", format!("unknown sort `{}` (free)", q.sort)));
    }
    let workload: Option<u64> =
        match q.workload.trim().trim_start_matches('#') {
            "" => None,
            w => Some(w.parse().map_err(|_| {
                ApiError::invalid("workload", format!("`{}` is not a workload id (a number)", q.workload))
            })?),
        };
    let by_free = q.sort == "free";
    let snap = s.lifecycle.snapshot();
    let ops = s.lifecycle.published().ops();
    let f = &snap.fleet;
    // Failed GPUs by node (few: one pass over them, not a lookup per GPU of the fleet).
    let mut failed: HashMap<&str, Vec<&tessera_store::GpuHealthRecord>> = HashMap::new();
    for r in ops.unhealthy.values() {
        failed.entry(r.node.as_str()).or_default().push(r);
    }
    let pools = views::pools(&snap)
        .into_iter()
        .zip(&f.pools)
        .map(|(v, p)| PoolRow {
            not_ready: (p.nodes.start as usize..p.nodes.end as usize)
                .filter(|&i| ops.node_state(&f.nodes[i].name) != NodeState::Ready)
                .count(),
            unhealthy: (p.nodes.start as usize..p.nodes.end as usize)
                .map(|i| failed.get(f.nodes[i].name.as_str()).map_or(0, Vec::len))
                .sum(),
            name: v.name,
            sharing: v.sharing,
            nodes: v.nodes,
            gpus: v.gpus,
            used: v.units_used,
            total: v.units_total,
        })
        .collect();
    // Racks: each node's rack, and every rack's free and total GPUs (one pass over the nodes).
    let rack_level = f.levels.level("rack");
    let rack_of = |i: usize| rack_level.and_then(|l| f.levels.domain_of(l, tessera_model::NodeId(i as u32)));
    let mut rack_gpus: HashMap<u32, (usize, usize)> = HashMap::new();
    // Blocks (the level above racks, where declared): nodes are grouped by pool, block, rack.
    let block_level = f.levels.level("block");
    let block_of = |i: usize| block_level.and_then(|l| f.levels.domain_of(l, tessera_model::NodeId(i as u32)));
    let block_name = |i: usize| {
        block_of(i)
            .zip(block_level)
            .map(|(b, l)| f.levels.domains(l)[b as usize].name.as_str())
    };
    let place = |i: usize| {
        (
            f.nodes[i].pool,
            block_of(i).unwrap_or(u32::MAX),
            rack_of(i).unwrap_or(u32::MAX),
            i,
        )
    };
    // Multi-node gangs: the nodes each workload holds GPUs on (one pass over the GPUs: a
    // workload on more than one node is a gang).
    let mut spans: HashMap<u64, (usize, usize)> = HashMap::new();
    for (i, ns) in snap.nodes.iter().enumerate() {
        if let Some(r) = rack_of(i) {
            let e = rack_gpus.entry(r).or_default();
            e.0 += ns.free_gpus();
            e.1 += ns.gpus.len();
        }
        for g in &ns.gpus {
            for h in &g.holders {
                let e = spans.entry(h.workload).or_insert((usize::MAX, 0));
                if e.0 != i {
                    *e = (i, e.1 + 1);
                }
            }
        }
    }
    let gang_nodes = |w: u64| spans.get(&w).map(|(_, n)| *n).filter(|n| *n > 1);
    // Nodes grouped by rack within their pool (fleet order otherwise).
    let swatches = fleet_palette(&snap, scope.as_deref());
    let highlight = swatches.contains_key(&q.highlight).then(|| q.highlight.clone());
    // Every rack's name, for the rack filter's choices.
    let rack_names: Vec<String> = rack_level
        .map(|l| f.levels.domains(l).iter().map(|d| d.name.clone()).collect())
        .unwrap_or_default();
    // The whole-fleet heat map: every GPU, by pool and rack (one pass over the GPUs).
    let mut heat: Vec<HeatGroup> = Vec::new();
    {
        let mut by_place: Vec<usize> = (0..f.nodes.len()).collect();
        by_place.sort_by_key(|&i| place(i));
        for i in by_place {
            let n = &f.nodes[i];
            let pool = &f.pool(n.pool).name;
            let rack_name = rack_of(i)
                .zip(rack_level)
                .map(|(r, l)| f.levels.domains(l)[r as usize].name.as_str());
            let block = block_name(i);
            if !heat
                .last()
                .is_some_and(|g| g.pool == *pool && g.block.as_deref() == block && g.rack.as_deref() == rack_name)
            {
                heat.push(HeatGroup {
                    pool: pool.clone(),
                    block: block.map(str::to_string),
                    rack: rack_name.map(str::to_string),
                    free: 0,
                    total: 0,
                    nodes: String::new(),
                    cells: String::new(),
                });
            }
            let g = heat.last_mut().expect("a group");
            let ns = &snap.nodes[i];
            let bad = failed.get(n.name.as_str()).map(Vec::as_slice).unwrap_or_default();
            if !g.nodes.is_empty() {
                g.nodes.push(',');
                g.cells.push(',');
            }
            g.nodes.push_str(&n.name);
            g.free += ns.free_gpus();
            g.total += ns.gpus.len();
            for (gi, gpu) in ns.gpus.iter().enumerate() {
                let c = if bad.iter().any(|r| r.gpu as usize == gi) {
                    'x'
                } else if highlight
                    .as_ref()
                    .is_some_and(|h| gpu.holders.iter().any(|x| x.tenant == *h))
                {
                    'h'
                } else {
                    match gpu.used_milli {
                        0 => '0',
                        1000.. => '2',
                        _ => '1',
                    }
                };
                g.cells.push(c);
            }
        }
    }
    let mut order: Vec<usize> = (0..f.nodes.len()).collect();
    if by_free {
        order.sort_by_key(|&i| (std::cmp::Reverse(snap.nodes[i].free_gpus()), i));
    } else {
        order.sort_by_key(|&i| place(i));
    }
    let mut tenants: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    let mut matched = 0;
    let mut shown = 0;
    let mut groups: Vec<RackGroup> = Vec::new();
    let first = q.page * PER_PAGE;
    for i in order {
        let n = &f.nodes[i];
        let pool = &f.pool(n.pool).name;
        if !q.pool.is_empty() && *pool != q.pool {
            continue;
        }
        if !q.node.is_empty() && !n.name.contains(q.node.trim()) {
            continue;
        }
        let rack = rack_of(i);
        let rack_name = rack
            .zip(rack_level)
            .map(|(r, l)| f.levels.domains(l)[r as usize].name.as_str());
        if !q.rack.is_empty() && rack_name != Some(q.rack.as_str()) {
            continue;
        }
        let state = ops.node_state(&n.name).as_str();
        if !q.state.is_empty() && state != q.state {
            continue;
        }
        let bad = failed.get(n.name.as_str()).map(Vec::as_slice).unwrap_or_default();
        if !q.health.is_empty() && bad.is_empty() {
            continue;
        }
        let ns = &snap.nodes[i];
        if !q.tenant.is_empty() && !ns.gpus.iter().any(|g| g.holders.iter().any(|h| h.tenant == q.tenant)) {
            continue;
        }
        // A tenant user finds only their own tenant's workloads.
        if let Some(w) = workload
            && !ns
                .gpus
                .iter()
                .any(|g| g.holders.iter().any(|h| h.workload == w && c.id.can_read(&h.tenant)))
        {
            continue;
        }
        matched += 1;
        if matched <= first || shown >= PER_PAGE {
            continue;
        }
        shown += 1;
        let mut gangs: Vec<(u64, usize)> = Vec::new();
        let cells = ns
            .gpus
            .iter()
            .enumerate()
            .map(|(gi, g)| {
                // The cell's tenant: the largest share the caller may read (their own before
                // another tenant's on a tenant user's map); another tenant's stays unnamed.
                let top = g
                    .holders
                    .iter()
                    .filter(|h| c.id.can_read(&h.tenant))
                    .max_by_key(|h| h.units.as_milli());
                let other = top.is_none() && !g.holders.is_empty();
                let tenant = top.map(|h| h.tenant.clone()).unwrap_or_default();
                let swatch = swatches.get(&tenant);
                if !tenant.is_empty() {
                    tenants.insert(tenant.clone());
                }
                let fill = match g.used_milli {
                    0 => "free",
                    1000.. => "full",
                    _ => "part",
                };
                let health = bad.iter().find(|r| r.gpu as usize == gi);
                let gang = top.and_then(|h| gang_nodes(h.workload).map(|k| (h.workload, k)));
                if let Some(x) = gang
                    && !gangs.contains(&x)
                {
                    gangs.push(x);
                }
                let mut label = if g.holders.is_empty() {
                    format!("GPU {gi}: free")
                } else {
                    format!(
                        "GPU {gi}: {} units used by {}",
                        tessera_model::GpuUnits(g.used_milli as u64),
                        holders_words(&g.holders, &c.id)
                    )
                };
                if let Some((w, k)) = gang {
                    label = format!("{label}; gang #{w} across {k} nodes");
                }
                if let Some(r) = health {
                    label = format!("{label}; {}", health_words(r));
                }
                if state != "ready" {
                    label = format!("{label}; node {state}");
                }
                Cell {
                    index: gi,
                    colour: if other {
                        OTHER
                    } else {
                        swatch.map_or(FREE, |w| w.colour)
                    },
                    pattern: swatch.map_or(0, |w| w.pattern),
                    key: swatch.map(|w| w.key.clone()).unwrap_or_default(),
                    dim: highlight.as_ref().is_some_and(|h| !tenant.is_empty() && *h != tenant),
                    label,
                    fill,
                    unhealthy: health.is_some(),
                    gang: gang.map(|(w, _)| w),
                }
            })
            .collect();
        let row = NodeRow {
            name: n.name.clone(),
            pool: pool.clone(),
            model: f.catalogue.get(n.model).name.clone(),
            state: state.to_string(),
            used: tessera_model::GpuUnits(ns.used_milli()).to_string(),
            free: ns.free_gpus(),
            unhealthy: bad.len(),
            cells,
            gangs,
        };
        // Sorted by free capacity, the rows stand in one group without rack headings.
        let (rack, rack_name, block) = if by_free {
            (None, None, None)
        } else {
            (rack, rack_name, block_name(i))
        };
        let same = groups.last().is_some_and(|g| {
            (by_free || g.pool == *pool) && g.block.as_deref() == block && g.rack.as_deref() == rack_name
        });
        if !same {
            let (free, total) = rack.and_then(|r| rack_gpus.get(&r).copied()).unwrap_or_default();
            groups.push(RackGroup {
                block: block.map(str::to_string),
                rack: rack_name.map(str::to_string),
                pool: pool.clone(),
                free,
                total,
                rows: Vec::new(),
            });
        }
        groups.last_mut().expect("a group").rows.push(row);
    }
    let admin = scope.is_none();
    let href = |page: usize, highlight: &str| {
        serde_urlencoded::to_string([
            ("pool", q.pool.as_str()),
            ("state", q.state.as_str()),
            ("tenant", q.tenant.as_str()),
            ("health", q.health.as_str()),
            ("rack", q.rack.as_str()),
            ("node", q.node.as_str()),
            ("workload", q.workload.as_str()),
            ("sort", q.sort.as_str()),
            ("highlight", highlight),
            ("page", &page.to_string()),
        ])
        .map(|qs| format!("/console/fleet?{qs}"))
        .unwrap_or_default()
    };
    let shown_highlight = if admin {
        highlight.as_deref().unwrap_or_default()
    } else {
        ""
    };
    let link = |page: usize| href(page, shown_highlight);
    let legend = tenants
        .into_iter()
        .filter_map(|t| {
            let w = swatches.get(&t)?;
            let on = highlight.as_deref() == Some(t.as_str());
            Some(LegendEntry {
                colour: w.colour,
                pattern: w.pattern,
                key: w.key.clone(),
                highlighted: on,
                href: href(q.page, if on { "" } else { &t }),
                tenant: t,
            })
        })
        .collect();
    let next = (matched > first + PER_PAGE).then(|| link(q.page + 1));
    let prev = (q.page > 0).then(|| link(q.page - 1));
    Ok(html(&FleetPage {
        chrome: Chrome::new(&c, &s, "fleet"),
        scope,
        tenant_names: swatches.keys().cloned().collect(),
        rack_names,
        pools,
        has_blocks: block_level.is_some(),
        heat,
        heat_href: format!(
            "/console/fleet?{}node=",
            highlight
                .as_deref()
                .filter(|_| admin)
                .and_then(|h| serde_urlencoded::to_string([("highlight", h)]).ok())
                .map(|q| q + "&")
                .unwrap_or_default()
        ),
        by_rack: groups.iter().any(|g| g.rack.is_some()),
        groups,
        shown,
        legend,
        highlight,
        pool_names: f.pools.iter().map(|p| p.name.clone()).collect(),
        matched,
        first,
        next,
        prev,
        q,
    }))
}

#[derive(Template)]
#[template(path = "console/fleet_node.html")]
struct NodeDetail {
    /// Whether the caller is a platform-admin (who may cordon, uncordon and drain).
    admin: bool,
    node: String,
    state: String,
    gpus: Vec<GpuView>,
    /// Per GPU index: what is wrong with it, if it failed.
    health: Vec<Option<String>>,
    /// Per GPU index: its latest telemetry in words, where the backend reported it lately.
    telemetry: Vec<Option<String>>,
    /// When that telemetry was sampled (RFC 3339), or why there is none.
    sampled: String,
    /// The fleet's tenant swatches, as on the map.
    swatches: BTreeMap<String, Swatch>,
}

impl NodeDetail {
    /// The classes of `tenant`'s swatch (colour and pattern).
    fn swatch(&self, tenant: &str) -> String {
        self.swatches.get(tenant).map_or_else(
            || classes(if tenant.is_empty() { FREE } else { OTHER }, 0),
            Swatch::classes,
        )
    }

    fn key(&self, tenant: &str) -> &str {
        self.swatches.get(tenant).map_or("", |w| w.key.as_str())
    }

    fn health_of(&self, gpu: &u8) -> Option<&str> {
        self.health.get(*gpu as usize).and_then(|h| h.as_deref())
    }

    fn telemetry_of(&self, gpu: &u8) -> Option<&str> {
        self.telemetry.get(*gpu as usize).and_then(|t| t.as_deref())
    }

    fn mark(&self) -> &'static str {
        state_mark(&self.state)
    }
}

/// `GET /console/fleet/nodes/{name}`: the node's GPUs with every MIG slice and fraction, its
/// workload and tenant. A tenant user reads another tenant's slices as "(another tenant)"
/// (no project, no workload) and the telemetry of the GPUs their own tenant holds only.
pub async fn node(State(s): State<AppState>, c: Caller, Path(name): Path<String>) -> Result<Response, ApiError> {
    let scope = map_scope(&c.id)?;
    let snap = s.lifecycle.snapshot();
    let Some(i) = snap.fleet.node_by_name(&name) else {
        return Err(ApiError::not_found(format!("no node `{name}`")));
    };
    let ops = s.lifecycle.published().ops();
    let mut gpus = Vec::new();
    views::gpus_of(&snap.fleet, i.0 as usize, &snap.nodes[i.0 as usize], &c.id, &mut gpus);
    let mut health = vec![None; gpus.len()];
    for ((_, g), r) in ops.unhealthy.range((name.clone(), 0)..=(name.clone(), u8::MAX)) {
        if let Some(h) = health.get_mut(*g as usize) {
            *h = Some(health_words(r));
        }
    }
    let (mut telemetry, sampled) = gpu_telemetry(
        &s.lifecycle.published().telemetry(),
        &name,
        gpus.len(),
        crate::clock::now_ms(),
    );
    if let Some(t) = &scope {
        let ns = &snap.nodes[i.0 as usize];
        for (gi, slot) in telemetry.iter_mut().enumerate() {
            let ours = ns
                .gpus
                .get(gi)
                .is_some_and(|g| g.holders.iter().any(|h| h.tenant == *t));
            if !ours {
                *slot = None;
            }
        }
    }
    Ok(html(&NodeDetail {
        admin: scope.is_none(),
        swatches: fleet_palette(&snap, scope.as_deref()),
        health,
        telemetry,
        sampled,
        state: ops.node_state(&name).as_str().to_string(),
        node: name,
        gpus,
    }))
}

/// Each GPU of `node` (`gpus` of them) in the latest telemetry, in words — utilisation,
/// memory in use of the board's, temperature, power —, and when it was sampled; nothing where
/// the telemetry is older than two minutes or the backend reports none.
fn gpu_telemetry(t: &Telemetry, node: &str, gpus: usize, now: i64) -> (Vec<Option<String>>, String) {
    let mut out = vec![None; gpus];
    if let Some(why) = super::stale_telemetry(t, now) {
        return (out, why);
    }
    for g in t.gpus.iter().filter(|g| g.node == node) {
        if let Some(slot) = out.get_mut(g.gpu as usize) {
            let total = g.fb_used_mib + g.fb_free_mib;
            *slot = Some(format!(
                "utilisation {:.0} % · memory {} of {} MiB ({:.0} %) · {:.0} °C · {:.0} W",
                g.util_pct,
                g.fb_used_mib,
                total,
                if total > 0 {
                    g.fb_used_mib as f64 * 100.0 / total as f64
                } else {
                    0.0
                },
                g.temp_c,
                g.power_w
            ));
        }
    }
    (out, format!("sampled at {}", tessera_api::rfc3339_ms(t.at)))
}

/// `POST /console/fleet/nodes/{name}/{action}` (platform-admins, htmx with the CSRF token):
/// cordon, uncordon or drain through the node-operations API; answers the node's detail.
pub async fn node_op(
    State(s): State<AppState>,
    c: Caller,
    Path((name, action)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    c.id.require_admin()?;
    let op = match action.as_str() {
        "cordon" => NodeOp::Cordon,
        "uncordon" => NodeOp::Uncordon,
        "drain" => NodeOp::Drain {
            deadline_ms: None,
            preempt: false,
        },
        _ => return Err(ApiError::not_found(format!("no node action `{action}`"))),
    };
    crate::services::nodes::act(&s, &c.id, &name, op).await?;
    node(State(s), c, Path(name)).await
}

#[derive(Template)]
#[template(path = "console/audit.html")]
struct AuditPage {
    chrome: Chrome,
    q: AuditQuery,
    rows: Vec<AuditRow>,
    /// Every tenant, for the tenant filter.
    tenants: Vec<String>,
    next: Option<String>,
}

/// One audit record as the page shows it: who by name, and what changed by its object.
pub struct AuditRow {
    pub r: tessera_store::AuditRecord,
    /// The actor: a token's name and id, else the actor as recorded.
    pub actor: String,
    /// The object and the change: `budget of tenant vision`, `node h100-03: cordon`.
    pub what: String,
}

/// What an audit record changed, in words: the object its route names (a tenant, project,
/// quota, budget, token, node or workload) and, where the handler said, the object it made.
pub fn audit_what(action: &str, target: &str, detail: &str, token_name: impl Fn(&str) -> Option<String>) -> String {
    // The lifecycle appends the workload a creation made: `/api/v1/workloads (workload 7)`.
    let (target, made) = match target.rsplit_once(" (") {
        Some((path, m)) if m.ends_with(')') => (path, Some(&m[..m.len() - 1])),
        _ => (target, None),
    };
    let route = target
        .strip_prefix("/api/v1/")
        .or_else(|| target.strip_prefix("/console/"))
        .unwrap_or(target);
    let parts: Vec<&str> = route.split('/').filter(|p| !p.is_empty()).collect();
    let token = |id: &str| match token_name(id) {
        Some(n) if !n.is_empty() => format!("token {n} ({id})"),
        _ => format!("token {id}"),
    };
    let object = match parts.as_slice() {
        ["tenants"] => "a tenant".to_string(),
        ["tenants", t] => format!("tenant {t}"),
        ["tenants", t, "projects"] => format!("a project of tenant {t}"),
        ["tenants", t, "projects", p, ..] => format!("project {t}/{p}"),
        ["tenants", t, "quotas", rest @ ..] => match rest {
            [] | ["remove"] => format!("a quota of tenant {t}"),
            [class, ..] => format!("quota {class} of tenant {t}"),
        },
        ["tenants", t, "budget"] => format!("budget of tenant {t}"),
        ["tenants", t, "priorities"] => format!("priority classes of tenant {t}"),
        ["tenants", t, "image-policy", ..] => format!("image policy of tenant {t}"),
        ["tenants", t, ..] => format!("tenant {t}"),
        ["tokens"] => "a token".to_string(),
        ["tokens", id, ..] => token(id),
        ["fleet", "nodes", n, op] | ["nodes", n, op] => format!("node {n}: {op}"),
        ["fleet", "nodes", n, ..] | ["nodes", n, ..] => format!("node {n}"),
        ["workloads"] => match made {
            Some(m) => format!("requested {m}"),
            None => "a workload".to_string(),
        },
        ["workloads", id, op] => format!("workload {id}: {op}"),
        ["workloads", id, ..] => format!("workload {id}"),
        ["signin"] | ["signout"] | ["login"] => parts[0].to_string(),
        _ => String::new(),
    };
    let verb = action.split(' ').next().unwrap_or_default();
    let mut out = match (detail.is_empty(), object.is_empty()) {
        (false, true) => detail.to_string(),
        (false, false) if detail.contains(' ') && (detail.starts_with("created") || object.starts_with('a')) => {
            detail.to_string()
        }
        (false, false) => format!("{object}: {detail}"),
        (true, false) => object,
        (true, true) => action.to_string(),
    };
    if verb == "denied" || verb == "rate-limited" {
        out = format!("{verb}: {out}");
    }
    out
}

#[derive(Deserialize, Default)]
pub struct AuditQuery {
    #[serde(default)]
    pub tenant: String,
    #[serde(default)]
    pub actor: String,
    #[serde(default)]
    pub action: String,
    /// Records before this sequence number (the next page).
    #[serde(default)]
    pub before: Option<u64>,
}

impl AuditPage {
    fn at(&self, ms: &i64) -> String {
        tessera_api::rfc3339_ms(*ms)
    }
}

/// `GET /console/audit` (platform-admins): the audit log, newest first, filtered by tenant,
/// actor and action (text contained in the action or its target), 200 records scanned a page.
pub async fn audit(State(s): State<AppState>, c: Caller, Query(q): Query<AuditQuery>) -> Result<Response, ApiError> {
    c.id.require_admin()?;
    let tenant = Some(q.tenant.clone()).filter(|t| !t.is_empty());
    let scanned = s.store.audit(tenant.as_deref(), q.before, 200).await?;
    let next = (scanned.len() == 200)
        .then(|| scanned.last().map(|r| r.seq))
        .flatten()
        .map(|seq| {
            let qs = serde_urlencoded::to_string([
                ("tenant", q.tenant.as_str()),
                ("actor", q.actor.as_str()),
                ("action", q.action.as_str()),
                ("before", &seq.to_string()),
            ])
            .unwrap_or_default();
            format!("/console/audit?{qs}")
        });
    // Token names by id (the admin sees every token), to name actors and tokens.
    let names: HashMap<String, String> = s
        .store
        .list_tokens(None)
        .await?
        .into_iter()
        .map(|t| (t.id, t.name))
        .collect();
    let name = |id: &str| names.get(id).cloned();
    let rows = scanned
        .into_iter()
        .map(|r| AuditRow {
            actor: match name(&r.actor) {
                Some(n) if !n.is_empty() => format!("{n} ({})", r.actor),
                _ => r.actor.clone(),
            },
            what: audit_what(&r.action, &r.target, &r.detail, name),
            r,
        })
        .filter(|x| q.actor.is_empty() || x.actor.contains(&q.actor))
        .filter(|x| {
            q.action.is_empty()
                || x.r.action.contains(&q.action)
                || x.r.target.contains(&q.action)
                || x.what.contains(&q.action)
        })
        .collect();
    Ok(html(&AuditPage {
        chrome: Chrome::new(&c, &s, "audit"),
        tenants: super::tenant_names(&s).await?,
        q,
        rows,
        next,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpus_telemetry_is_shown_while_fresh_and_its_age_said_otherwise() {
        let g = |node: &str, gpu: u8| tessera_backend::GpuSample {
            node: node.into(),
            gpu,
            uuid: format!("GPU-{node}-{gpu}"),
            model: "H100".into(),
            util_pct: 62.6,
            fb_used_mib: 20_000,
            fb_free_mib: 60_000,
            temp_c: 51.2,
            power_w: 301.0,
            xid: 0,
            instances: Vec::new(),
        };
        let t = Telemetry {
            at: 1_000_000,
            gpus: std::sync::Arc::new(vec![g("a", 1), g("b", 0)]),
        };
        let (per_gpu, when) = gpu_telemetry(&t, "a", 2, 1_000_000 + 60_000);
        assert_eq!(per_gpu[0], None, "GPU 0 of node a was not reported");
        assert_eq!(
            per_gpu[1].as_deref(),
            Some("utilisation 63 % · memory 20000 of 80000 MiB (25 %) · 51 °C · 301 W")
        );
        assert!(when.starts_with("sampled at 1970-01-01T00:16:40"), "{when}");
        let (stale, why) = gpu_telemetry(&t, "a", 2, 1_000_000 + 180_000);
        assert!(stale.iter().all(Option::is_none));
        assert!(why.starts_with("no telemetry since"), "{why}");
        let none = Telemetry {
            at: 0,
            gpus: Default::default(),
        };
        assert_eq!(
            gpu_telemetry(&none, "a", 2, 5).1,
            "the backend has reported no telemetry"
        );
    }

    #[test]
    fn audit_rows_name_their_object() {
        let names = |id: &str| (id == "7").then(|| "ci-bot".to_string());
        let w = |action: &str, target: &str, detail: &str| audit_what(action, target, detail, names);
        assert_eq!(
            w("POST /console/tenants", "/console/tenants", "created tenant stark"),
            "created tenant stark"
        );
        assert_eq!(
            w(
                "POST /console/tenants/{tenant}/budget",
                "/console/tenants/vision/budget",
                ""
            ),
            "budget of tenant vision"
        );
        assert_eq!(
            w("POST /console/tokens/{id}/revoke", "/console/tokens/7/revoke", ""),
            "token ci-bot (7)"
        );
        assert_eq!(
            w(
                "POST /console/fleet/nodes/{name}/{action}",
                "/console/fleet/nodes/h100-03/cordon",
                ""
            ),
            "node h100-03: cordon"
        );
        assert_eq!(
            w(
                "PUT /api/v1/tenants/{tenant}/priorities",
                "/api/v1/tenants/nlp/priorities",
                "priority classes standard → high"
            ),
            "priority classes of tenant nlp: priority classes standard → high"
        );
        assert_eq!(
            w("denied POST /console/tenants", "/console/tenants", ""),
            "denied: a tenant"
        );
        // A creation through the API: the workload the lifecycle made, the tenant and token
        // the handlers name.
        assert_eq!(
            w("POST /api/v1/workloads", "/api/v1/workloads (workload 300)", ""),
            "requested workload 300"
        );
        assert_eq!(
            w("POST /api/v1/tenants", "/api/v1/tenants", "created tenant stark"),
            "created tenant stark"
        );
        assert_eq!(
            w(
                "POST /api/v1/tokens",
                "/api/v1/tokens",
                "created token tok-1 (ci-bot), member of tenant stark"
            ),
            "created token tok-1 (ci-bot), member of tenant stark"
        );
        assert_eq!(
            w(
                "POST /console/tenants/{tenant}/projects/{project}/delete",
                "/console/tenants/vision/projects/train/delete",
                ""
            ),
            "project vision/train"
        );
    }

    #[test]
    fn tenant_colours_are_stable_and_spread() {
        assert_eq!(colour("vision"), colour("vision"));
        assert_eq!(colour(""), FREE, "free capacity has its own colour");
        let used: std::collections::HashSet<u8> =
            ["vision", "nlp", "speech", "robotics", "ads", "search", "maps", "chat"]
                .iter()
                .map(|t| colour(t))
                .collect();
        assert!(used.len() >= 4, "{used:?}");
    }

    #[test]
    fn ten_tenants_get_ten_distinct_colours_and_keys_stably() {
        let ten = [
            "vision", "nlp", "speech", "robotics", "ads", "search", "maps", "chat", "stark", "wayne",
        ];
        let p = palette(ten);
        assert_eq!(p.len(), 10);
        let colours: std::collections::HashSet<u8> = p.values().map(|w| w.colour).collect();
        assert_eq!(colours.len(), 10, "{p:?}");
        assert!(colours.iter().all(|&c| c < PALETTE));
        let keys: std::collections::HashSet<&str> = p.values().map(|w| w.key.as_str()).collect();
        assert_eq!(keys.len(), 10);
        assert_eq!(p["ads"].key, "A", "keys follow name order");
        // The same set in another order (and with repeats and free capacity) gives the same swatches.
        let mut shuffled: Vec<&str> = ten.iter().rev().copied().collect();
        shuffled.extend(["vision", "", "nlp"]);
        assert_eq!(palette(shuffled), p);
        // Sixteen tenants still get sixteen colours; past that, the keys keep them apart.
        let many: Vec<String> = (0..40).map(|i| format!("t{i:02}")).collect();
        let p = palette(many.iter().map(String::as_str));
        let first16: std::collections::HashSet<u8> = p.values().take(16).map(|w| w.colour).collect();
        assert_eq!(first16.len(), 16);
        let keys: std::collections::HashSet<&str> = p.values().map(|w| w.key.as_str()).collect();
        assert_eq!(keys.len(), 40);
        assert_eq!(p["t26"].key, "AA");
    }

    #[test]
    fn past_sixteen_tenants_a_pattern_keeps_every_pair_distinct() {
        let twenty: Vec<String> = (0..20).map(|i| format!("team{i:02}")).collect();
        let p = palette(twenty.iter().map(String::as_str));
        let pairs: std::collections::HashSet<(u8, u8)> = p.values().map(|w| (w.colour, w.pattern)).collect();
        assert_eq!(pairs.len(), 20, "{p:?}");
        assert!(p.values().take(16).all(|w| w.pattern == 0), "the first 16 are solid");
        assert!(p.values().skip(16).all(|w| w.pattern == 1), "the next are hatched");
        assert_eq!(p["team00"].classes(), format!("t{}", p["team00"].colour));
        assert_eq!(p["team19"].classes(), format!("t{} p1", p["team19"].colour));
        // Up to 96 tenants (16 colours × 6 patterns) no two share colour and pattern.
        let many: Vec<String> = (0..96).map(|i| format!("x{i:03}")).collect();
        let p = palette(many.iter().map(String::as_str));
        let pairs: std::collections::HashSet<(u8, u8)> = p.values().map(|w| (w.colour, w.pattern)).collect();
        assert_eq!(pairs.len(), 96);
        assert!(p.values().all(|w| w.colour < PALETTE && w.pattern < PATTERNS));
        // Stable: the same set in another order gives the same swatches.
        assert_eq!(palette(many.iter().rev().map(String::as_str)), p);
    }
}
