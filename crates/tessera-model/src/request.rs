//! What a workload asks for.
//!
//! A request asks for exactly one GPU shape — N whole GPUs (a gang: one node, and one NVLink
//! domain when N > 1 on NVLink nodes), one MIG profile, or a fraction of a shared GPU — plus
//! host CPU and memory, and optionally a pool, a model whitelist and a tenant.
//!
//! A [`GangRequest`] asks for N whole GPUs beyond one node: node-shares of G GPUs each (whole
//! nodes by default; then, when asked, the last share may hold the remainder, 12 = 8 + 4), all placed or none, under a topology constraint at a level of the fleet
//! ([`crate::levels`]) and optionally in segments of S GPUs that each stay within one rack.

use std::fmt;

use crate::catalogue::{Catalogue, ModelId};
use crate::fleet::{MAX_GPUS_PER_NODE, PoolId};
use crate::units::GpuUnits;

/// A tenant, as the core sees it: an opaque number. Names live in the control plane.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TenantId(pub u32);

/// A MIG profile request resolved against the catalogue: the profile's display name and, for
/// every model that offers a profile of that name, the profile's index in the model's geometry.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MigChoice {
    pub name: String,
    pub options: Vec<(ModelId, u8)>,
}

/// The numbers of a profile name in the form `profile_name` writes (`3g.40gb`, `1g.10gb+me`:
/// no sign, no leading zero), or `None`.
fn parse_profile_name(name: &str) -> Option<(u32, u32, bool)> {
    let (rest, me) = match name.strip_suffix("+me") {
        Some(rest) => (rest, true),
        None => (name, false),
    };
    let (sm, gb) = rest.strip_suffix("gb")?.split_once("g.")?;
    let number = |s: &str| {
        let canonical = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
        canonical.then(|| s.parse::<u32>().ok()).flatten()
    };
    Some((number(sm)?, number(gb)?, me))
}

impl MigChoice {
    /// Resolves `spec` (`3g.40gb`, or `MODEL:ID` such as `A100-80GB:9`) against `catalogue`.
    pub fn resolve(catalogue: &Catalogue, spec: &str) -> Result<MigChoice, RequestError> {
        let spec = spec.trim();
        if let Some((model, id)) = spec.split_once(':') {
            let m = catalogue
                .find(model)
                .ok_or_else(|| RequestError::field("mig", format!("unknown GPU model `{model}`")))?;
            let gm = catalogue.get(m);
            let geom = gm
                .mig
                .ok_or_else(|| RequestError::field("mig", format!("{} is not MIG-capable", gm.name)))?;
            let idx = id
                .parse::<u32>()
                .ok()
                .and_then(|id| geom.profile_index(id))
                .ok_or_else(|| RequestError::field("mig", format!("{} has no MIG profile ID `{id}`", gm.name)))?;
            return Ok(MigChoice {
                name: gm.profile_name(&geom.profiles[idx]),
                options: vec![(m, idx as u8)],
            });
        }
        let lower = spec.to_ascii_lowercase();
        let mut options = Vec::new();
        // `<G>g.<N>gb[+me]` compared by its numbers (no name is formatted per profile: every
        // restart resolves each stored MIG request), written exactly as `profile_name` writes it.
        if let Some((sm, gb, me)) = parse_profile_name(&lower) {
            for (id, m) in catalogue.models() {
                if let Some(geom) = m.mig {
                    for (i, p) in geom.profiles.iter().enumerate() {
                        if u32::from(p.sm_slices) == sm && p.media_extensions == me && m.profile_gb(p) == gb {
                            options.push((id, i as u8));
                        }
                    }
                }
            }
        }
        if options.is_empty() {
            return Err(RequestError::field(
                "mig",
                format!("no GPU model offers MIG profile `{spec}` (examples: 1g.10gb, 3g.40gb, 7g.80gb on A100-80GB)"),
            ));
        }
        Ok(MigChoice { name: lower, options })
    }
}

/// The GPU shape of a request.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Shape {
    /// `gpus` whole GPUs on one node (one NVLink domain when the node has NVLink).
    Whole { gpus: u8 },
    /// One MIG instance.
    Mig(MigChoice),
    /// A fraction of one time-sliced GPU, in milli-GPU (1..=999), optionally with GPU memory.
    Fraction { milli: u16, memory_mib: Option<u32> },
    /// No GPU: host CPU and memory only (the trace has such pods).
    CpuOnly,
}

/// A placement request.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Request {
    pub shape: Shape,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    /// Restrict to one pool.
    pub pool: Option<PoolId>,
    /// Allowed GPU models; empty = any.
    pub models: Vec<ModelId>,
    pub tenant: Option<TenantId>,
}

/// A request that can never be valid, naming the offending field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct RequestError {
    pub field: &'static str,
    pub message: String,
}

impl RequestError {
    pub fn field(field: &'static str, message: impl Into<String>) -> Self {
        RequestError {
            field,
            message: message.into(),
        }
    }
}

impl Request {
    pub fn new(shape: Shape) -> Self {
        Request {
            shape,
            cpu_milli: 0,
            memory_mib: 0,
            pool: None,
            models: Vec::new(),
            tenant: None,
        }
    }

    pub fn whole(gpus: u8) -> Self {
        Self::new(Shape::Whole { gpus })
    }

    pub fn fraction(milli: u16) -> Self {
        Self::new(Shape::Fraction {
            milli,
            memory_mib: None,
        })
    }

    pub fn mig(catalogue: &Catalogue, profile: &str) -> Result<Self, RequestError> {
        Ok(Self::new(Shape::Mig(MigChoice::resolve(catalogue, profile)?)))
    }

    pub fn with_host(mut self, cpu_milli: u64, memory_mib: u64) -> Self {
        self.cpu_milli = cpu_milli;
        self.memory_mib = memory_mib;
        self
    }

    pub fn with_tenant(mut self, tenant: TenantId) -> Self {
        self.tenant = Some(tenant);
        self
    }

    pub fn with_pool(mut self, pool: PoolId) -> Self {
        self.pool = Some(pool);
        self
    }

    pub fn with_models(mut self, models: Vec<ModelId>) -> Self {
        self.models = models;
        self
    }

    /// Checks the shape's own bounds (not whether the fleet can ever hold it).
    pub fn check(&self) -> Result<(), RequestError> {
        match &self.shape {
            Shape::Whole { gpus } => {
                if *gpus == 0 || *gpus > MAX_GPUS_PER_NODE {
                    return Err(RequestError::field(
                        "gpus",
                        format!("{gpus} whole GPUs: must be between 1 and {MAX_GPUS_PER_NODE}"),
                    ));
                }
            }
            Shape::Fraction { milli, .. } => {
                if *milli == 0 || *milli >= 1000 {
                    return Err(RequestError::field(
                        "fraction",
                        format!(
                            "{milli} milli-GPU: a fraction must be between 1 and 999 (ask for whole GPUs for 1000)"
                        ),
                    ));
                }
            }
            Shape::Mig(c) => {
                if c.options.is_empty() {
                    return Err(RequestError::field("mig", format!("no model offers `{}`", c.name)));
                }
            }
            Shape::CpuOnly => {}
        }
        Ok(())
    }

    /// The GPU units this request will hold once placed. For MIG the units depend only on the
    /// profile's memory-slice share, identical on every model that offers the same name.
    pub fn units(&self, catalogue: &Catalogue) -> GpuUnits {
        match &self.shape {
            Shape::Whole { gpus } => GpuUnits::whole(*gpus as u64),
            Shape::Fraction { milli, .. } => GpuUnits::milli(*milli as u64),
            Shape::Mig(c) => c
                .options
                .first()
                .map(|&(m, i)| {
                    let gm = catalogue.get(m);
                    gm.profile_units(&gm.mig.expect("MIG option on a MIG model").profiles[i as usize])
                })
                .unwrap_or_default(),
            Shape::CpuOnly => GpuUnits::ZERO,
        }
    }

    /// Whether `model` passes the request's whitelist.
    pub fn allows_model(&self, model: ModelId) -> bool {
        self.models.is_empty() || self.models.contains(&model)
    }
}

/// How strictly a gang keeps to one domain of a level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TopologyMode {
    /// The whole gang within one domain of the level, or it waits (refused if no domain of
    /// the level could ever hold it).
    Required,
    /// One domain of the level if one has room; else the fewest domains of the levels above.
    Preferred,
}

/// A gang's topology constraint: a level name of the fleet (`rack`, `block`, a label key) or
/// `pool`, and how strictly.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TopologyConstraint {
    pub level: String,
    pub mode: TopologyMode,
}

impl TopologyConstraint {
    pub fn required(level: &str) -> Self {
        TopologyConstraint {
            level: level.to_string(),
            mode: TopologyMode::Required,
        }
    }

    pub fn preferred(level: &str) -> Self {
        TopologyConstraint {
            level: level.to_string(),
            mode: TopologyMode::Preferred,
        }
    }
}

/// The most GPUs a gang may ask for.
pub const MAX_GANG_GPUS: u32 = 1 << 16;

/// N whole GPUs across nodes, as node-shares of G GPUs each (one share per node, on one NVLink
/// domain of it): all placed together or none.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GangRequest {
    /// GPUs in all (N).
    pub gpus: u32,
    /// GPUs per node-share (G); `None`: whole nodes (G is the GPU count of the pool's nodes).
    pub gpus_per_node: Option<u8>,
    /// `None`: preferred at the fleet's lowest level (the fewest racks possible).
    pub topology: Option<TopologyConstraint>,
    /// Groups of S GPUs, each within one domain of the lowest level (a rack); S is a multiple
    /// of G and N of S.
    pub segment: Option<u32>,
    /// Host CPU and memory per node-share.
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub pool: Option<PoolId>,
    /// Allowed GPU models; empty = any.
    pub models: Vec<ModelId>,
    pub tenant: Option<TenantId>,
    /// Whole nodes only: N need not be a multiple of G, the last share holding the remainder
    /// N mod G on one node (12 on 8-GPU nodes = 8 + 4, the Philly protocol's shape). Off (the
    /// default, as the API asks): N is a multiple of G.
    pub remainder: bool,
}

impl GangRequest {
    /// `gpus` GPUs as whole nodes.
    pub fn whole_nodes(gpus: u32) -> Self {
        GangRequest {
            gpus,
            gpus_per_node: None,
            topology: None,
            segment: None,
            cpu_milli: 0,
            memory_mib: 0,
            pool: None,
            models: Vec::new(),
            tenant: None,
            remainder: false,
        }
    }

    /// Whole nodes with a remainder share allowed ([`Self::remainder`]).
    pub fn with_remainder(mut self) -> Self {
        self.remainder = true;
        self
    }

    /// `nodes` node-shares of `gpus_per_node` GPUs each.
    pub fn nodes(nodes: u32, gpus_per_node: u8) -> Self {
        GangRequest {
            gpus_per_node: Some(gpus_per_node),
            ..Self::whole_nodes(nodes.saturating_mul(gpus_per_node as u32))
        }
    }

    pub fn with_topology(mut self, t: TopologyConstraint) -> Self {
        self.topology = Some(t);
        self
    }

    pub fn with_segment(mut self, gpus: u32) -> Self {
        self.segment = Some(gpus);
        self
    }

    pub fn with_host(mut self, cpu_milli: u64, memory_mib: u64) -> Self {
        self.cpu_milli = cpu_milli;
        self.memory_mib = memory_mib;
        self
    }

    pub fn with_pool(mut self, pool: PoolId) -> Self {
        self.pool = Some(pool);
        self
    }

    pub fn with_tenant(mut self, tenant: TenantId) -> Self {
        self.tenant = Some(tenant);
        self
    }

    pub fn with_models(mut self, models: Vec<ModelId>) -> Self {
        self.models = models;
        self
    }

    /// Checks the gang's own arithmetic, given G (`per_node`: the request's, or the pool's
    /// node size in whole-node mode): N a multiple of G, except for whole nodes with
    /// [`Self::with_remainder`]: any N, as ⌈N / G⌉ shares, ⌊N / G⌋ whole nodes and one share of
    /// the remainder N mod G GPUs on one node (12 on 8-GPU nodes: 8 + 4), as the Philly
    /// protocol shapes a gang; a segment (a multiple of G dividing N) rules a remainder out.
    pub fn check_with(&self, per_node: u8) -> Result<(), RequestError> {
        let n = self.gpus;
        if n == 0 || n > MAX_GANG_GPUS {
            return Err(RequestError::field(
                "gpus",
                format!("{n} GPUs in a gang: must be between 1 and {MAX_GANG_GPUS}"),
            ));
        }
        if per_node == 0 || per_node > MAX_GPUS_PER_NODE {
            return Err(RequestError::field(
                "gpus_per_node",
                format!("{per_node} GPUs per node: must be between 1 and {MAX_GPUS_PER_NODE}"),
            ));
        }
        let g = per_node as u32;
        // N is K × G, except for whole nodes with a remainder share (N mod G on the last).
        let remainder_ok = self.remainder && self.gpus_per_node.is_none();
        if !(n.is_multiple_of(g) || remainder_ok) {
            let what = if self.gpus_per_node.is_some() {
                format!("{g} GPUs per node")
            } else {
                format!("whole nodes of {g} GPUs")
            };
            return Err(RequestError::field(
                "gpus",
                format!("{n} GPUs as {what}: ask for a multiple of {g}"),
            ));
        }
        if let Some(s) = self.segment
            && (s == 0 || !s.is_multiple_of(g) || !n.is_multiple_of(s))
        {
            let remainder = if n.is_multiple_of(g) {
                ""
            } else {
                " (a gang with a remainder share has no segments)"
            };
            return Err(RequestError::field(
                "segment",
                format!(
                    "segments of {s} GPUs: a segment is a multiple of the {g} GPUs per node and divides the gang's {n}{remainder}"
                ),
            ));
        }
        if let Some(t) = &self.topology
            && t.level.trim().is_empty()
        {
            return Err(RequestError::field("topology", "a topology constraint names a level"));
        }
        Ok(())
    }

    /// The GPUs of its last, smaller node-share given G (`per_node`): N mod G for whole nodes
    /// with a remainder share (12 on 8-GPU nodes: 8 + 4, so 4), else 0 (every share holds G).
    pub fn remainder_gpus(&self, per_node: u8) -> u32 {
        match (self.remainder, self.gpus_per_node, per_node) {
            (true, None, g) if g > 0 => self.gpus % g as u32,
            _ => 0,
        }
    }

    /// The GPU units the gang holds once placed.
    pub fn units(&self) -> GpuUnits {
        GpuUnits::whole(self.gpus as u64)
    }

    /// Whether `model` passes the request's whitelist.
    pub fn allows_model(&self, model: ModelId) -> bool {
        self.models.is_empty() || self.models.contains(&model)
    }
}

impl fmt::Display for GangRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a gang of {} GPUs", self.gpus)?;
        match self.gpus_per_node {
            Some(g) => write!(f, " ({} nodes × {g})", self.gpus / g.max(1) as u32)?,
            None => f.write_str(" (whole nodes)")?,
        }
        if let Some(s) = self.segment {
            write!(f, " in segments of {s}")?;
        }
        Ok(())
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Shape::Whole { gpus } => {
                write!(f, "{gpus} whole GPU{}", if *gpus == 1 { "" } else { "s" })
            }
            Shape::Mig(c) => write!(f, "MIG {}", c.name),
            Shape::Fraction { milli, .. } => write!(f, "{milli} milli-GPU"),
            Shape::CpuOnly => write!(f, "CPU only"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name resolves to exactly the profiles whose formatted name it is, on every model of
    /// the catalogue; other spellings of the numbers resolve to nothing.
    #[test]
    fn mig_names_resolve_to_the_profiles_so_named() {
        let c = Catalogue::builtin();
        let mut names: Vec<String> = Vec::new();
        for (_, m) in c.models() {
            for p in m.mig.iter().flat_map(|g| g.profiles.iter()) {
                names.push(m.profile_name(p));
            }
        }
        assert!(names.len() > 20, "{names:?}");
        for name in &names {
            let named: Vec<(ModelId, u8)> = c
                .models()
                .flat_map(|(id, m)| {
                    let profiles = m.mig.map(|g| g.profiles).unwrap_or(&[]);
                    profiles
                        .iter()
                        .enumerate()
                        .filter(|(_, p)| m.profile_name(p) == *name)
                        .map(move |(i, _)| (id, i as u8))
                        .collect::<Vec<_>>()
                })
                .collect();
            let got = MigChoice::resolve(&c, &format!(" {} ", name.to_uppercase())).unwrap();
            assert_eq!(got.options, named, "{name}");
            assert_eq!(&got.name, name);
        }
        for bad in [
            "03g.40gb",
            "3g.040gb",
            "+3g.40gb",
            "3g.40",
            "3g.40gb+",
            "3g.40gb+me",
            "g.40gb",
            "3g.gb",
            "",
        ] {
            assert!(MigChoice::resolve(&c, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn mig_names_resolve_across_models() {
        let c = Catalogue::builtin();
        let r = MigChoice::resolve(&c, "3g.40gb").unwrap();
        // A100-80GB (SXM and PCIe), H100 SXM and H100 PCIe all call their 3g profile 3g.40gb.
        assert_eq!(r.options.len(), 4);
        // `1g.10gb` is the 1g on 80 GB boards (1/8 of memory) and the double-memory 1g on an
        // A100-40GB (2/8): the name is not a key, so both are options with their own units.
        let r = MigChoice::resolve(&c, "1g.10gb").unwrap();
        let units: Vec<_> = r
            .options
            .iter()
            .map(|&(m, i)| c.get(m).profile_units(&c.get(m).mig.unwrap().profiles[i as usize]))
            .collect();
        assert!(units.contains(&GpuUnits::milli(125)) && units.contains(&GpuUnits::milli(250)));
        assert!(MigChoice::resolve(&c, "3g.99gb").is_err());
        let pinned = MigChoice::resolve(&c, "A30:0").unwrap();
        assert_eq!(pinned.name, "4g.24gb");
        assert!(
            MigChoice::resolve(&c, "L40S:0")
                .unwrap_err()
                .message
                .contains("not MIG-capable")
        );
    }

    #[test]
    fn bounds() {
        assert!(Request::fraction(0).check().is_err());
        assert!(Request::fraction(1000).check().is_err());
        assert!(Request::fraction(999).check().is_ok());
        assert!(Request::whole(0).check().is_err());
        assert!(Request::whole(17).check().is_err());
        assert_eq!(
            Request::fraction(250).units(&Catalogue::builtin()),
            GpuUnits::milli(250)
        );
    }

    #[test]
    fn gang_bounds() {
        assert!(GangRequest::whole_nodes(64).check_with(8).is_ok());
        let e = GangRequest::whole_nodes(60).check_with(8).unwrap_err();
        assert_eq!(
            e.to_string(),
            "gpus: 60 GPUs as whole nodes of 8 GPUs: ask for a multiple of 8"
        );
        // Whole nodes with a remainder share: 60 = 7 × 8 + 4, 12 = 8 + 4.
        assert!(GangRequest::whole_nodes(60).with_remainder().check_with(8).is_ok());
        assert_eq!(GangRequest::whole_nodes(60).with_remainder().remainder_gpus(8), 4);
        assert_eq!(GangRequest::whole_nodes(12).with_remainder().remainder_gpus(8), 4);
        assert_eq!(GangRequest::whole_nodes(16).with_remainder().remainder_gpus(8), 0);
        assert_eq!(GangRequest::whole_nodes(12).remainder_gpus(8), 0);
        // Equal shares still need a multiple, remainder or not.
        let mut equal = GangRequest::nodes(3, 4).with_remainder();
        equal.gpus = 14;
        let e = equal.check_with(4).unwrap_err();
        assert_eq!(
            e.to_string(),
            "gpus: 14 GPUs as 4 GPUs per node: ask for a multiple of 4"
        );
        assert_eq!(equal.remainder_gpus(4), 0);
        // A remainder has no segments.
        let e = GangRequest::whole_nodes(12)
            .with_remainder()
            .with_segment(8)
            .check_with(8)
            .unwrap_err();
        assert_eq!(e.field, "segment");
        assert!(e.message.ends_with("(a gang with a remainder share has no segments)"));
        assert!(GangRequest::whole_nodes(0).check_with(8).is_err());
        assert!(GangRequest::nodes(8, 4).check_with(4).is_ok());
        assert_eq!(GangRequest::nodes(8, 4).gpus, 32);
        assert!(GangRequest::nodes(4, 17).check_with(17).is_err());
        let seg = GangRequest::whole_nodes(64).with_segment(16);
        assert!(seg.check_with(8).is_ok());
        for bad in [12, 0, 48] {
            let e = GangRequest::whole_nodes(64)
                .with_segment(bad)
                .check_with(8)
                .unwrap_err();
            assert_eq!(e.field, "segment", "{bad}");
        }
        assert_eq!(
            GangRequest::nodes(4, 2).with_segment(4).to_string(),
            "a gang of 8 GPUs (4 nodes × 2) in segments of 4"
        );
    }
}
