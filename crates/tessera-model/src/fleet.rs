//! The fleet: pools of nodes, each node with its GPUs, host CPU/memory and NVLink topology.
//!
//! A fleet is described by a TOML file (format documented in `fleets/seed.toml`, which is also
//! the built-in `seed` preset), generated synthetically for benchmarks, or loaded from the openb
//! trace's node list (see [`crate::fleet::Fleet::from_openb_nodes`]). Errors name the file, the
//! line and the field.
//!
//! Above the node, a fleet file may place each node group in racks (`rack`, or
//! `nodes_per_rack`) and blocks (`block`): the fleet's [`Levels`] `rack` and `block`. Other
//! sources of levels (node labels) use [`Fleet::with_levels`].

use std::fmt;
use std::ops::Range;

use serde::Deserialize;
use toml::Spanned;

use crate::catalogue::{Catalogue, ModelId, NvLink};
use crate::levels::{LevelError, Levels};

/// The `seed` preset's fleet file.
pub const SEED_TOML: &str = include_str!("../../../fleets/seed.toml");

/// How the GPUs of a pool are shared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Sharing {
    /// Whole GPUs only.
    Whole,
    /// MIG instances created on demand.
    Mig,
    /// Time-sliced fractions (milli-GPU) and whole GPUs.
    Shared,
}

impl fmt::Display for Sharing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Sharing::Whole => "whole",
            Sharing::Mig => "mig",
            Sharing::Shared => "shared",
        })
    }
}

/// GPU interconnect inside a node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Topology {
    /// All GPUs on one NVSwitch fabric: one NVLink domain.
    #[serde(rename = "nvswitch")]
    NvSwitch,
    /// NVLink bridges join GPUs (0,1), (2,3), …: domains of two.
    Pairs,
    /// PCIe only: no NVLink domain; multi-GPU gangs need only share the node.
    #[default]
    None,
}

impl Topology {
    /// The NVLink domains of a node with `gpus` GPUs, as GPU bit masks; `None` topology yields
    /// one PCIe domain covering the node (gangs still need a single node).
    pub fn domains(self, gpus: u8) -> Vec<u16> {
        let all = if gpus == 0 { 0 } else { ((1u32 << gpus) - 1) as u16 };
        match self {
            Topology::NvSwitch | Topology::None => vec![all],
            Topology::Pairs => (0..gpus)
                .step_by(2)
                .map(|i| if i + 1 < gpus { 0b11 << i } else { 1 << i })
                .collect(),
        }
    }
}

/// Index of a pool in a fleet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PoolId(pub u16);

/// Index of a node in a fleet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(pub u32);

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pool {
    pub name: String,
    pub sharing: Sharing,
    /// Shared pools: whether fractions of different tenants may share one GPU.
    pub allow_tenant_mixing: bool,
    /// Shared pools: whether a request for whole GPUs may be given a GPU there (true where
    /// the backend hands out a GPU itself; false where it cannot: Kubernetes' device plugin
    /// hands out time-sliced replicas, which may come from different GPUs).
    pub whole_gpus: bool,
    /// The pool's nodes are the contiguous range `nodes` of [`Fleet::nodes`].
    pub nodes: Range<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub name: String,
    pub pool: PoolId,
    pub model: ModelId,
    pub gpus: u8,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub topology: Topology,
}

/// A complete fleet description.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fleet {
    pub catalogue: Catalogue,
    pub pools: Vec<Pool>,
    pub nodes: Vec<Node>,
    /// The network topology above the node (racks, blocks); empty when none is declared.
    pub levels: Levels,
}

/// A malformed fleet or trace file: one line naming the file, line and field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {field}: {message}")]
pub struct FleetError {
    pub file: String,
    /// 1-based line; 0 when the error concerns the file as a whole.
    pub line: usize,
    pub field: String,
    pub message: String,
}

impl FleetError {
    pub fn new(file: &str, line: usize, field: &str, message: impl Into<String>) -> Self {
        FleetError {
            file: file.to_string(),
            line,
            field: field.to_string(),
            message: message.into(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FleetSpec {
    #[serde(default)]
    model: Vec<ModelSpec>,
    #[serde(default)]
    pool: Vec<Spanned<PoolSpec>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelSpec {
    name: Spanned<String>,
    #[serde(default)]
    memory_gib: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PoolSpec {
    name: Spanned<String>,
    sharing: Sharing,
    #[serde(default)]
    allow_tenant_mixing: Option<Spanned<bool>>,
    #[serde(default)]
    whole_gpus: Option<Spanned<bool>>,
    #[serde(default)]
    nodes: Vec<NodeSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeSpec {
    name: Spanned<String>,
    #[serde(default)]
    count: Option<Spanned<u32>>,
    gpu_model: Spanned<String>,
    gpus: Spanned<u32>,
    cpus: Spanned<u32>,
    memory_gib: Spanned<u64>,
    #[serde(default)]
    nvlink: Option<Spanned<Topology>>,
    /// Every node of the group in this rack.
    #[serde(default)]
    rack: Option<Spanned<String>>,
    /// The group fills racks of this many nodes, in order, named `{rack_prefix}{i}`.
    #[serde(default)]
    nodes_per_rack: Option<Spanned<u32>>,
    /// The racks' name prefix with `nodes_per_rack` (default `{name}-r`).
    #[serde(default)]
    rack_prefix: Option<Spanned<String>>,
    /// Every node (and rack) of the group in this block (spine).
    #[serde(default)]
    block: Option<Spanned<String>>,
}

/// The fleet file's levels above the node, lowest first.
pub const FILE_LEVELS: [&str; 2] = ["rack", "block"];

/// A group's rack per instance (`rack`, or `nodes_per_rack` with `rack_prefix`), or `None`.
#[allow(clippy::type_complexity)]
fn group_racks<'a>(
    n: &'a NodeSpec,
    base: &str,
    err: &dyn Fn(Range<usize>, &str, String) -> FleetError,
) -> Result<Option<Box<dyn Fn(usize) -> String + 'a>>, FleetError> {
    match (&n.rack, &n.nodes_per_rack, &n.rack_prefix) {
        (Some(r), None, None) => {
            let r = r.get_ref().trim().to_string();
            if r.is_empty() {
                return Err(err(
                    n.rack.as_ref().unwrap().span(),
                    "rack",
                    "an empty rack name".into(),
                ));
            }
            Ok(Some(Box::new(move |_| r.clone())))
        }
        (Some(r), _, _) => Err(err(
            r.span(),
            "rack",
            "`rack` puts the whole group in one rack; with `nodes_per_rack` name the racks with `rack_prefix`".into(),
        )),
        (None, Some(per), prefix) => {
            let per_rack = *per.get_ref();
            if per_rack == 0 {
                return Err(err(
                    per.span(),
                    "nodes_per_rack",
                    "a rack holds at least one node".into(),
                ));
            }
            let prefix = match prefix {
                Some(p) if p.get_ref().trim().is_empty() => {
                    return Err(err(p.span(), "rack_prefix", "an empty rack prefix".into()));
                }
                Some(p) => p.get_ref().trim().to_string(),
                None => format!("{base}-r"),
            };
            Ok(Some(Box::new(move |i| format!("{prefix}{}", i / per_rack as usize))))
        }
        (None, None, Some(p)) => Err(err(
            p.span(),
            "rack_prefix",
            "`rack_prefix` names the racks of `nodes_per_rack`, which is missing".into(),
        )),
        (None, None, None) => Ok(None),
    }
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].bytes().filter(|&b| b == b'\n').count() + 1
}

/// The most GPUs a node may declare (GPU masks are 16 bits wide).
pub const MAX_GPUS_PER_NODE: u8 = 16;

impl Fleet {
    /// The built-in `seed` fleet: 480 GPUs in pools `training`, `serving` and `development`.
    pub fn seed() -> Fleet {
        Fleet::from_toml(SEED_TOML, "seed").expect("the seed fleet is valid")
    }

    /// A preset by name: `seed`, or `synthetic:NODES`.
    pub fn preset(name: &str) -> Option<Fleet> {
        if name == "seed" {
            return Some(Fleet::seed());
        }
        let n = name.strip_prefix("synthetic:")?.parse().ok()?;
        Some(Fleet::synthetic(n))
    }

    /// A fleet of `nodes` 8-GPU servers in the seed's proportions (16 : 28 : 16 nodes of
    /// H100 whole / A100 MIG / L40S shared), for benchmarks at scale; the training servers in
    /// racks of 16 (`h100-r0`, …), where multi-node gangs go.
    pub fn synthetic(nodes: u32) -> Fleet {
        let training = nodes * 16 / 60;
        let serving = nodes * 28 / 60;
        let development = nodes - training - serving;
        let text = format!(
            "[[pool]]\nname = \"training\"\nsharing = \"whole\"\n[[pool.nodes]]\nname = \"h100\"\ncount = {training}\ngpu_model = \"H100-80GB-SXM\"\ngpus = 8\ncpus = 112\nmemory_gib = 2048\nnvlink = \"nvswitch\"\nnodes_per_rack = 16\n\
             [[pool]]\nname = \"serving\"\nsharing = \"mig\"\n[[pool.nodes]]\nname = \"a100\"\ncount = {serving}\ngpu_model = \"A100-80GB\"\ngpus = 8\ncpus = 128\nmemory_gib = 1024\nnvlink = \"nvswitch\"\n\
             [[pool]]\nname = \"development\"\nsharing = \"shared\"\n[[pool.nodes]]\nname = \"l40s\"\ncount = {development}\ngpu_model = \"L40S\"\ngpus = 8\ncpus = 64\nmemory_gib = 512\n"
        );
        Fleet::from_toml(&text, "synthetic").expect("synthetic fleet is valid")
    }

    /// Parses a TOML fleet file. `file` names it in errors.
    pub fn from_toml(text: &str, file: &str) -> Result<Fleet, FleetError> {
        let spec: FleetSpec = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| line_of(text, s.start)).unwrap_or(0);
            let msg = e.message().trim().replace('\n', " ");
            // The key of the line the error points at (`gpus = "8"` → gpus, `[[pool.nodes]]` →
            // pool.nodes); toml names a missing key in its message ("missing field `gpus`").
            let field = e
                .span()
                .and_then(|s| {
                    let start = text[..s.start.min(text.len())].rfind('\n').map_or(0, |i| i + 1);
                    text[start..].lines().next()
                })
                .and_then(|l| l.split('=').next())
                .map(|k| k.trim().trim_start_matches('[').trim_end_matches(']').to_string())
                .filter(|k| !k.is_empty() && k.len() < 40 && !k.contains(['"', ' ']))
                .unwrap_or_else(|| "fleet".to_string());
            FleetError::new(file, line, &field, msg)
        })?;
        let err =
            |span: Range<usize>, field: &str, msg: String| FleetError::new(file, line_of(text, span.start), field, msg);
        let mut catalogue = Catalogue::builtin();
        for m in &spec.model {
            if catalogue.find(m.name.get_ref()).is_some() {
                return Err(err(
                    m.name.span(),
                    "model.name",
                    format!("model `{}` is already in the catalogue", m.name.get_ref()),
                ));
            }
            catalogue.add_opaque(m.name.get_ref(), m.memory_gib * 1024);
        }
        let mut fleet = Fleet {
            catalogue,
            pools: Vec::new(),
            nodes: Vec::new(),
            levels: Levels::none(),
        };
        // Per node: its group's span (errors about levels point there), rack and block.
        let mut placed: Vec<(Range<usize>, Option<String>, Option<String>)> = Vec::new();
        let mut names = std::collections::HashSet::new();
        for pool in &spec.pool {
            let pool_span = pool.span();
            let pool = pool.get_ref();
            let pname = pool.name.get_ref().trim();
            if pname.is_empty() || !pname.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
                return Err(err(
                    pool.name.span(),
                    "pool.name",
                    format!("`{pname}` is not a valid pool name (letters, digits, '-' and '_')"),
                ));
            }
            if fleet.pools.iter().any(|p| p.name == pname) {
                return Err(err(
                    pool.name.span(),
                    "pool.name",
                    format!("pool `{pname}` is declared twice"),
                ));
            }
            if let Some(mix) = &pool.allow_tenant_mixing
                && *mix.get_ref()
                && pool.sharing != Sharing::Shared
            {
                return Err(err(
                    mix.span(),
                    "pool.allow_tenant_mixing",
                    "only shared pools can mix tenants on one GPU".into(),
                ));
            }
            if let Some(w) = &pool.whole_gpus
                && !*w.get_ref()
                && pool.sharing != Sharing::Shared
            {
                return Err(err(
                    w.span(),
                    "pool.whole_gpus",
                    "only shared pools can refuse whole GPUs".into(),
                ));
            }
            if pool.nodes.is_empty() {
                return Err(err(pool_span, "pool.nodes", format!("pool `{pname}` has no nodes")));
            }
            let pool_id = PoolId(fleet.pools.len() as u16);
            let first = fleet.nodes.len() as u32;
            for n in &pool.nodes {
                let model_name = n.gpu_model.get_ref();
                let model = fleet.catalogue.find(model_name).ok_or_else(|| {
                    err(n.gpu_model.span(), "gpu_model", format!("unknown GPU model `{model_name}` (declare it in a [[model]] table, or use a catalogue name such as H100-80GB-SXM, A100-80GB, L40S)"))
                })?;
                let m = fleet.catalogue.get(model);
                let gpus = *n.gpus.get_ref();
                if gpus > MAX_GPUS_PER_NODE as u32 {
                    return Err(err(
                        n.gpus.span(),
                        "gpus",
                        format!("{gpus} GPUs per node; at most {MAX_GPUS_PER_NODE} are supported"),
                    ));
                }
                if pool.sharing == Sharing::Mig && m.mig.is_none() {
                    return Err(err(
                        n.gpu_model.span(),
                        "gpu_model",
                        format!("pool `{pname}` shares by MIG but {} is not MIG-capable", m.name),
                    ));
                }
                if *n.cpus.get_ref() == 0 {
                    return Err(err(n.cpus.span(), "cpus", "a node needs at least one CPU".into()));
                }
                if *n.memory_gib.get_ref() == 0 {
                    return Err(err(
                        n.memory_gib.span(),
                        "memory_gib",
                        "a node needs host memory".into(),
                    ));
                }
                let topology = n.nvlink.as_ref().map(|t| *t.get_ref()).unwrap_or_default();
                if let Some(t) = &n.nvlink
                    && *t.get_ref() != Topology::None
                    && m.nvlink == NvLink::None
                {
                    return Err(err(t.span(), "nvlink", format!("{} has no NVLink", m.name)));
                }
                let count = n.count.as_ref().map(|c| *c.get_ref());
                let base = n.name.get_ref().trim();
                if base.is_empty() {
                    return Err(err(n.name.span(), "name", "a node needs a name".into()));
                }
                let instances: Vec<String> = match count {
                    None => vec![base.to_string()],
                    Some(c) => {
                        let width = c.saturating_sub(1).to_string().len().max(2);
                        (0..c).map(|i| format!("{base}-{i:0width$}")).collect()
                    }
                };
                let racks = group_racks(n, base, &err)?;
                let block = match &n.block {
                    Some(b) if b.get_ref().trim().is_empty() => {
                        return Err(err(b.span(), "block", "an empty block name".into()));
                    }
                    Some(b) => Some(b.get_ref().trim().to_string()),
                    None => None,
                };
                for (i, name) in instances.into_iter().enumerate() {
                    placed.push((n.name.span(), racks.as_ref().map(|r| r(i)), block.clone()));
                    if !names.insert(name.clone()) {
                        return Err(err(n.name.span(), "name", format!("node `{name}` is declared twice")));
                    }
                    fleet.nodes.push(Node {
                        name,
                        pool: pool_id,
                        model,
                        gpus: gpus as u8,
                        cpu_milli: *n.cpus.get_ref() as u64 * 1000,
                        memory_mib: *n.memory_gib.get_ref() * 1024,
                        topology,
                    });
                }
            }
            fleet.pools.push(Pool {
                name: pname.to_string(),
                sharing: pool.sharing,
                allow_tenant_mixing: pool.allow_tenant_mixing.as_ref().map(|m| *m.get_ref()).unwrap_or(false),
                whole_gpus: pool.whole_gpus.as_ref().is_none_or(|w| *w.get_ref()),
                nodes: first..fleet.nodes.len() as u32,
            });
        }
        if fleet.pools.is_empty() {
            return Err(FleetError::new(file, 0, "pool", "the fleet declares no [[pool]]"));
        }
        // Only the levels some group uses: a fleet without racks has no `rack` level.
        let used: Vec<usize> = (0..FILE_LEVELS.len())
            .filter(|&l| {
                placed
                    .iter()
                    .any(|p| if l == 0 { p.1.is_some() } else { p.2.is_some() })
            })
            .collect();
        let names: Vec<String> = used.iter().map(|&l| FILE_LEVELS[l].to_string()).collect();
        fleet.levels = Levels::build(&fleet.nodes, &names, |n, l| {
            if used[l] == 0 {
                placed[n].1.clone()
            } else {
                placed[n].2.clone()
            }
        })
        .map_err(|e: LevelError| {
            let span = e.node_index.map(|i| placed[i].0.clone()).unwrap_or(0..0);
            let line = if e.node_index.is_some() {
                line_of(text, span.start)
            } else {
                0
            };
            let message = match &e.node {
                Some(n) => format!("node `{n}`: {}", e.message),
                None => e.message.clone(),
            };
            FleetError::new(file, line, &e.level, message)
        })?;
        Ok(fleet)
    }

    /// This fleet with levels from any per-node values (node labels): `names` lowest first
    /// (`["rack", "block"]`, or label keys such as `nvidia.com/gpu.clique`), `value(node,
    /// level)` the node's domain at that level or `None` where its pool has none. Checked as
    /// [`Levels::build`] says.
    pub fn with_levels(
        mut self,
        names: &[String],
        value: impl FnMut(usize, usize) -> Option<String>,
    ) -> Result<Fleet, LevelError> {
        self.levels = Levels::build(&self.nodes, names, value)?;
        Ok(self)
    }

    /// Loads the openb trace node list (`sn,cpu_milli,memory_mib,gpu,model`) as one `shared`
    /// pool named `openb` whose GPUs may mix tenants (the trace has none). Unknown model names
    /// (G1–G3) become opaque catalogue models.
    pub fn from_openb_nodes(text: &str, file: &str) -> Result<Fleet, FleetError> {
        let mut catalogue = Catalogue::builtin();
        let mut nodes = Vec::new();
        let mut lines = text.lines().enumerate();
        let header = lines.next().map(|(_, h)| h.trim()).unwrap_or("");
        const HEADER: [&str; 5] = ["sn", "cpu_milli", "memory_mib", "gpu", "model"];
        let cols: Vec<&str> = header.split(',').map(str::trim).collect();
        if cols.len() < 5 || cols[..5] != HEADER {
            return Err(FleetError::new(
                file,
                1,
                "header",
                format!("expected columns `{}`, found `{header}`", HEADER.join(",")),
            ));
        }
        for (i, line) in lines {
            let lineno = i + 1;
            if line.trim().is_empty() {
                continue;
            }
            let f: Vec<&str> = line.split(',').map(str::trim).collect();
            if f.len() < 5 {
                return Err(FleetError::new(
                    file,
                    lineno,
                    "row",
                    format!("expected 5 fields, found {}", f.len()),
                ));
            }
            let num = |idx: usize| -> Result<u64, FleetError> {
                f[idx].parse::<u64>().map_err(|_| {
                    FleetError::new(
                        file,
                        lineno,
                        HEADER[idx],
                        format!("`{}` is not a non-negative integer", f[idx]),
                    )
                })
            };
            let (cpu, mem, gpus) = (num(1)?, num(2)?, num(3)?);
            if gpus > MAX_GPUS_PER_NODE as u64 {
                return Err(FleetError::new(
                    file,
                    lineno,
                    "gpu",
                    format!("{gpus} GPUs; at most {MAX_GPUS_PER_NODE} per node"),
                ));
            }
            if f[0].is_empty() {
                return Err(FleetError::new(file, lineno, "sn", "empty node name"));
            }
            let model_name = if f[4].is_empty() { "NONE" } else { f[4] };
            if gpus > 0 && f[4].is_empty() {
                return Err(FleetError::new(file, lineno, "model", "a node with GPUs needs a model"));
            }
            let model = match catalogue.find(model_name) {
                Some(m) => m,
                None => catalogue.add_opaque(model_name, 0),
            };
            nodes.push(Node {
                name: f[0].to_string(),
                pool: PoolId(0),
                model,
                gpus: gpus as u8,
                cpu_milli: cpu,
                memory_mib: mem,
                topology: Topology::None,
            });
        }
        if nodes.is_empty() {
            return Err(FleetError::new(file, 0, "rows", "the node list is empty"));
        }
        let pool = Pool {
            name: "openb".into(),
            sharing: Sharing::Shared,
            allow_tenant_mixing: true,
            whole_gpus: true,
            nodes: 0..nodes.len() as u32,
        };
        Ok(Fleet {
            catalogue,
            pools: vec![pool],
            nodes,
            levels: Levels::none(),
        })
    }

    pub fn pool(&self, id: PoolId) -> &Pool {
        &self.pools[id.0 as usize]
    }

    pub fn pool_by_name(&self, name: &str) -> Option<PoolId> {
        self.pools.iter().position(|p| p.name == name).map(|i| PoolId(i as u16))
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.0 as usize]
    }

    pub fn node_by_name(&self, name: &str) -> Option<NodeId> {
        self.nodes.iter().position(|n| n.name == name).map(|i| NodeId(i as u32))
    }

    /// Total GPUs in the fleet.
    pub fn gpu_count(&self) -> u64 {
        self.nodes.iter().map(|n| n.gpus as u64).sum()
    }

    /// The largest GPU count of any node in `pool` (or the fleet).
    pub fn max_gpus_per_node(&self, pool: Option<PoolId>) -> u8 {
        self.nodes
            .iter()
            .filter(|n| pool.is_none_or(|p| n.pool == p))
            .map(|n| n.gpus)
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_has_480_gpus_in_three_pools() {
        let f = Fleet::seed();
        assert_eq!(f.gpu_count(), 480);
        assert_eq!(f.nodes.len(), 60);
        let names: Vec<_> = f
            .pools
            .iter()
            .map(|p| (p.name.as_str(), p.sharing, p.nodes.len()))
            .collect();
        assert_eq!(
            names,
            [
                ("training", Sharing::Whole, 16),
                ("serving", Sharing::Mig, 28),
                ("development", Sharing::Shared, 16)
            ]
        );
        assert_eq!(f.nodes[0].name, "h100-00");
        assert_eq!(f.nodes[0].topology, Topology::NvSwitch);
        assert_eq!(f.catalogue.get(f.nodes[20].model).name, "A100-80GB");
        // Racks: 4 of 4 training servers, 4 of 7 serving, 2 of 8 development; no blocks.
        assert_eq!(f.levels.names(), ["rack"]);
        let racks: Vec<(&str, usize)> = f
            .levels
            .domains(0)
            .iter()
            .map(|d| (d.name.as_str(), d.nodes.len()))
            .collect();
        assert_eq!(&racks[..5], [("r0", 4), ("r1", 4), ("r2", 4), ("r3", 4), ("s0", 7)]);
        assert_eq!(racks.len(), 10);
        assert_eq!(f.levels.domain_name(0, NodeId(5)), Some("r1"));
    }

    fn group(extra: &str) -> String {
        format!(
            "[[pool]]\nname = \"p\"\nsharing = \"whole\"\n[[pool.nodes]]\nname = \"n\"\ncount = 6\ngpu_model = \"L40S\"\ngpus = 8\ncpus = 8\nmemory_gib = 8\n{extra}"
        )
    }

    #[test]
    fn racks_and_blocks_from_the_file() {
        let f = Fleet::from_toml(&group("nodes_per_rack = 4\nblock = \"b0\"\n"), "f.toml").unwrap();
        assert_eq!(f.levels.names(), ["rack", "block"]);
        assert_eq!(f.levels.path(NodeId(5)), vec![("rack", "n-r1"), ("block", "b0")]);
        assert_eq!(f.levels.domains(0)[1].nodes, vec![4, 5]);
        assert_eq!(f.levels.domains(0)[0].parent, Some(0));
        let f = Fleet::from_toml(&group("rack = \"x\"\n"), "f.toml").unwrap();
        assert_eq!(f.levels.domains(0).len(), 1);
        assert!(Fleet::from_toml(&group(""), "f.toml").unwrap().levels.is_empty());
    }

    #[test]
    fn rack_errors_name_file_line_and_field() {
        let e = Fleet::from_toml(&group("nodes_per_rack = 0\n"), "f.toml").unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (11, "nodes_per_rack"), "{e}");
        let e = Fleet::from_toml(&group("rack = \"a\"\nnodes_per_rack = 2\n"), "f.toml").unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (11, "rack"), "{e}");
        let e = Fleet::from_toml(&group("rack_prefix = \"a\"\n"), "f.toml").unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (11, "rack_prefix"), "{e}");
        // A second group of the pool without a rack.
        let two = group("rack = \"a\"\n")
            + "[[pool.nodes]]\nname = \"m\"\ngpu_model = \"L40S\"\ngpus = 8\ncpus = 8\nmemory_gib = 8\n";
        let e = Fleet::from_toml(&two, "f.toml").unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (13, "rack"), "{e}");
        assert!(e.message.contains("node `m`: no rack, but node `n-00`"), "{e}");
        // A rack in two pools.
        let pools = group("rack = \"a\"\n")
            + &group("rack = \"a\"\n")
                .replace("\"p\"", "\"q\"")
                .replace("\"n\"", "\"o\"");
        let e = Fleet::from_toml(&pools, "f.toml").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("f.toml:16: rack: node `o-00`: rack `a` holds node `n-00` of another pool"),
            "{e}"
        );
    }

    #[test]
    fn levels_from_labels() {
        let f = Fleet::seed();
        let names = vec!["nvidia.com/gpu.clique".to_string()];
        let f = f
            .with_levels(&names, |n, _| (n < 16).then(|| format!("clique-{}", n / 8)))
            .unwrap();
        assert_eq!(f.levels.path(NodeId(9)), vec![("nvidia.com/gpu.clique", "clique-1")]);
        assert!(f.levels.domain_of(0, NodeId(20)).is_none());
    }

    #[test]
    fn synthetic_scales() {
        let f = Fleet::synthetic(10_000);
        assert_eq!(f.nodes.len(), 10_000);
        assert_eq!(f.gpu_count(), 80_000);
        assert_eq!(Fleet::preset("synthetic:60").unwrap().gpu_count(), 480);
    }

    #[test]
    fn topology_domains() {
        assert_eq!(Topology::NvSwitch.domains(8), vec![0xff]);
        assert_eq!(Topology::Pairs.domains(4), vec![0b11, 0b1100]);
        assert_eq!(Topology::Pairs.domains(3), vec![0b11, 0b100]);
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let bad_model = "[[pool]]\nname = \"p\"\nsharing = \"whole\"\n[[pool.nodes]]\nname = \"n\"\ngpu_model = \"H900\"\ngpus = 8\ncpus = 8\nmemory_gib = 8\n";
        let e = Fleet::from_toml(bad_model, "f.toml").unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (6, "gpu_model"), "{e}");
        assert!(
            e.to_string()
                .starts_with("f.toml:6: gpu_model: unknown GPU model `H900`"),
            "{e}"
        );

        let bad_sharing = bad_model.replace("\"whole\"", "\"sliced\"").replace("H900", "L40S");
        let e = Fleet::from_toml(&bad_sharing, "f.toml").unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (3, "sharing"), "{e}");
        assert!(e.message.contains("unknown variant `sliced`"), "{e}");

        let missing = bad_model.replace("gpus = 8\n", "").replace("H900", "L40S");
        let e = Fleet::from_toml(&missing, "f.toml").unwrap_err();
        assert!(e.message.contains("missing field `gpus`"), "{e}");
        assert!(e.line >= 4, "{e}");

        let not_mig = bad_model.replace("\"whole\"", "\"mig\"").replace("H900", "L40S");
        let e = Fleet::from_toml(&not_mig, "f.toml").unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (6, "gpu_model"), "{e}");

        let typo = bad_model.replace("cpus", "cpu").replace("H900", "L40S");
        let e = Fleet::from_toml(&typo, "f.toml").unwrap_err();
        assert!(e.message.contains("unknown field `cpu`"), "{e}");
        assert_eq!((e.line, e.field.as_str()), (8, "cpu"), "{e}");

        // A value of the wrong type is named by its key, not by the value.
        let e = Fleet::from_toml(&bad_model.replace("gpus = 8", "gpus = \"8\""), "f.toml").unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (7, "gpus"), "{e}");

        // Only a shared pool may refuse whole GPUs; one that does says so.
        let refuses = bad_model
            .replace("H900", "L40S")
            .replace("sharing = \"whole\"\n", "sharing = \"whole\"\nwhole_gpus = false\n");
        let e = Fleet::from_toml(&refuses, "f.toml").unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (4, "pool.whole_gpus"), "{e}");
        let shared = refuses.replace("\"whole\"", "\"shared\"");
        let f = Fleet::from_toml(&shared, "f.toml").unwrap();
        assert!(!f.pools[0].whole_gpus);
        let f = Fleet::from_toml(&shared.replace("whole_gpus = false\n", ""), "f.toml").unwrap();
        assert!(
            f.pools[0].whole_gpus,
            "a shared pool gives whole GPUs unless told not to"
        );
    }

    #[test]
    fn openb_nodes() {
        let csv =
            "sn,cpu_milli,memory_mib,gpu,model\nn0,96000,393216,8,G2\nn1,64000,262144,2,P100\nn2,32000,65536,0,\n";
        let f = Fleet::from_openb_nodes(csv, "nodes.csv").unwrap();
        assert_eq!(f.gpu_count(), 10);
        assert!(f.catalogue.get(f.nodes[0].model).opaque);
        assert_eq!(f.catalogue.get(f.nodes[1].model).name, "P100");
        let e = Fleet::from_openb_nodes("sn,cpu_milli,memory_mib,gpu,model\nn0,9x,1,1,T4\n", "nodes.csv").unwrap_err();
        assert_eq!(
            e.to_string(),
            "nodes.csv:2: cpu_milli: `9x` is not a non-negative integer"
        );
        let e = Fleet::from_openb_nodes("name,cpu\n", "nodes.csv").unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (1, "header"));
    }
}
