//! The GPU catalogue: every GPU model Tessera knows and the MIG geometry of those that can be
//! partitioned.
//!
//! Source: `shared/reference/gpu-partitioning.md` (NVIDIA MIG User Guide, `nvidia-smi mig -lgipp`
//! transcripts, mig-parted). Tags in the comments follow that document: [V] verified,
//! [O] observed once, [I] inferred, [U] unknown.
//!
//! MIG profiles are keyed by `(model, profile ID)`, the device-specific ID that
//! `nvidia-smi mig -lgip` shows and NVML's `CreateGpuInstanceWithPlacement` takes. The display
//! name (`3g.40gb`, `1g.10gb+me`) is derived from the slice counts and the board's memory the way
//! NVIDIA's go-nvlib derives it, and is never used as a key.

use std::fmt;

use crate::units::GpuUnits;

/// One GPU-instance profile of a MIG geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MigProfile {
    /// NVML profile ID (device-specific, e.g. 19 = 1g on A100/H100, 14 = 1g on A30).
    pub id: u32,
    /// Compute (SM) slices: the `<G>` of `<G>g.<N>gb`.
    pub sm_slices: u8,
    /// Memory slices occupied by a placement (the placement `size`).
    pub mem_slices: u8,
    /// Most instances of this profile on one GPU (NVML `instanceCount`).
    pub max_instances: u8,
    /// Legal placement starts, in memory slices (`nvidia-smi mig -lgipp`).
    pub starts: &'static [u8],
    /// `+me`: the one 1g/2g instance that owns the media engines.
    pub media_extensions: bool,
}

impl MigProfile {
    /// Bit mask of the memory slices a placement at `start` occupies.
    pub const fn mask_at(&self, start: u8) -> u16 {
        (((1u32 << self.mem_slices) - 1) << start) as u16
    }
}

/// The MIG geometry shared by a family of GPUs.
#[derive(Debug, PartialEq, Eq)]
pub struct MigGeometry {
    /// Short name of the geometry, for messages and tests.
    pub name: &'static str,
    /// Memory slices per GPU (8, or 4 on A30).
    pub mem_slices: u8,
    /// SM slices per GPU usable in MIG mode (7, or 4 on A30).
    pub sm_slices: u8,
    /// All GPU-instance profiles with C == G (compute instance covers the whole GI).
    pub profiles: &'static [MigProfile],
}

impl MigGeometry {
    /// Index (into `profiles`) of the profile with NVML profile ID `id`.
    pub fn profile_index(&self, id: u32) -> Option<usize> {
        self.profiles.iter().position(|p| p.id == id)
    }

    /// Bit mask with one bit per memory slice.
    pub const fn full_mask(&self) -> u16 {
        ((1u32 << self.mem_slices) - 1) as u16
    }
}

/// The common 8-memory-slice placement table (`-lgipp`), byte-identical on A100-40GB, H100 80GB
/// and H100 NVL [V]; H200 and B200 use the same IDs, counts and fractions, the table itself is
/// [I] for them (see the model entries).
#[rustfmt::skip]
pub static MIG_8_SLICE: MigGeometry = MigGeometry {
    name: "8-slice",
    mem_slices: 8,
    sm_slices: 7,
    profiles: &[
        // 1g: memory slices 0..6; slice 7 is reachable only by larger profiles (the 7-vs-8 quirk).
        MigProfile { id: 19, sm_slices: 1, mem_slices: 1, max_instances: 7, starts: &[0, 1, 2, 3, 4, 5, 6], media_extensions: false },
        MigProfile { id: 20, sm_slices: 1, mem_slices: 1, max_instances: 1, starts: &[0, 1, 2, 3, 4, 5, 6], media_extensions: true },
        // 1g with double memory (e.g. 1g.20gb on 80 GB boards, 1g.10gb on A100-40GB).
        MigProfile { id: 15, sm_slices: 1, mem_slices: 2, max_instances: 4, starts: &[0, 2, 4, 6], media_extensions: false },
        MigProfile { id: 14, sm_slices: 2, mem_slices: 2, max_instances: 3, starts: &[0, 2, 4], media_extensions: false },
        MigProfile { id: 9, sm_slices: 3, mem_slices: 4, max_instances: 2, starts: &[0, 4], media_extensions: false },
        MigProfile { id: 5, sm_slices: 4, mem_slices: 4, max_instances: 1, starts: &[0], media_extensions: false },
        MigProfile { id: 0, sm_slices: 7, mem_slices: 8, max_instances: 1, starts: &[0], media_extensions: false },
    ],
};

/// A30-24GB, 4 memory slices and 4 SM slices; `-lgipp` from two transcripts [V]. Instance counts
/// are mig-parted's hard-coded 4/1/2/1/1 because NVML reports wrong ones on A30 [V].
#[rustfmt::skip]
pub static MIG_A30: MigGeometry = MigGeometry {
    name: "A30 4-slice",
    mem_slices: 4,
    sm_slices: 4,
    profiles: &[
        MigProfile { id: 14, sm_slices: 1, mem_slices: 1, max_instances: 4, starts: &[0, 1, 2, 3], media_extensions: false },
        MigProfile { id: 21, sm_slices: 1, mem_slices: 1, max_instances: 1, starts: &[0, 1, 2, 3], media_extensions: true },
        MigProfile { id: 5, sm_slices: 2, mem_slices: 2, max_instances: 2, starts: &[0, 2], media_extensions: false },
        MigProfile { id: 6, sm_slices: 2, mem_slices: 2, max_instances: 1, starts: &[0, 2], media_extensions: true },
        MigProfile { id: 0, sm_slices: 4, mem_slices: 4, max_instances: 1, starts: &[0], media_extensions: false },
    ],
};

/// NVLink capability of a GPU model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NvLink {
    /// No NVLink (PCIe only), e.g. L40S, T4.
    None,
    /// NVLink bridges between pairs of boards (PCIe cards such as H100 PCIe, A100 PCIe).
    Bridge,
    /// NVLink through an NVSwitch baseboard (HGX/DGX 8-GPU), all-to-all.
    Switch,
}

/// Index of a model in a [`Catalogue`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ModelId(pub u16);

/// One GPU model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuModel {
    /// Canonical name, the key used in fleet files (`H100-80GB-SXM`).
    pub name: String,
    /// Other accepted spellings (case-insensitive), e.g. the openb trace's `V100M32`.
    pub aliases: Vec<String>,
    /// Total framebuffer in MiB as NVML reports it; 0 when unknown (opaque trace models).
    pub memory_mib: u32,
    /// Nominal memory in GB, used to derive MIG profile names (go-nvlib rounds the same way).
    pub name_gb: u32,
    /// Streaming multiprocessors; 0 when unknown.
    pub sms: u32,
    /// MIG geometry, `None` for GPUs that cannot be partitioned.
    pub mig: Option<&'static MigGeometry>,
    pub nvlink: NvLink,
    /// True when the model is not described by the reference (e.g. `G2` in the Alibaba trace).
    pub opaque: bool,
}

impl GpuModel {
    /// The display name of a MIG profile on this model, e.g. `3g.40gb`, `1g.10gb+me`.
    ///
    /// go-nvlib computes `GB = round(fraction × total GB)` with rounding half away from zero;
    /// with the nominal board size this gives the published names for every model in the
    /// reference (H200: 1g.18gb, 1g.35gb, 3g.71gb, 7g.141gb; A30: 1g.6gb; B200: 1g.23gb).
    pub fn profile_name(&self, p: &MigProfile) -> String {
        let me = if p.media_extensions { "+me" } else { "" };
        format!("{}g.{}gb{}", p.sm_slices, self.profile_gb(p), me)
    }

    /// The `<N>` of a profile's `<G>g.<N>gb` name on this model (see [`Self::profile_name`]).
    pub fn profile_gb(&self, p: &MigProfile) -> u32 {
        let geom = self.mig.expect("profile_gb on a non-MIG model");
        let num = p.mem_slices as u32 * self.name_gb * 2;
        let den = geom.mem_slices as u32 * 2;
        // round half away from zero of (mem_slices × GB / slices)
        (num + den / 2) / den
    }

    /// GPU units of one instance of `p` on this model.
    pub fn profile_units(&self, p: &MigProfile) -> GpuUnits {
        let geom = self.mig.expect("profile_units on a non-MIG model");
        GpuUnits::mig(p.mem_slices, geom.mem_slices)
    }

    /// Finds a MIG profile by display name (`3g.40gb`) or by numeric profile ID (`9`).
    pub fn find_profile(&self, spec: &str) -> Option<&'static MigProfile> {
        let geom = self.mig?;
        let spec = spec.trim();
        if let Ok(id) = spec.parse::<u32>() {
            return geom.profiles.iter().find(|p| p.id == id);
        }
        let spec = spec.to_ascii_lowercase();
        geom.profiles.iter().find(|p| self.profile_name(p) == spec)
    }

    fn matches_name(&self, name: &str) -> bool {
        self.name.eq_ignore_ascii_case(name) || self.aliases.iter().any(|a| a.eq_ignore_ascii_case(name))
    }
}

/// The set of GPU models a fleet uses: the built-in ones plus opaque models named in a fleet file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Catalogue {
    models: Vec<GpuModel>,
}

impl Default for Catalogue {
    fn default() -> Self {
        Self::builtin()
    }
}

#[allow(clippy::too_many_arguments)]
fn model(
    name: &str,
    aliases: &[&str],
    memory_mib: u32,
    name_gb: u32,
    sms: u32,
    mig: Option<&'static MigGeometry>,
    nvlink: NvLink,
) -> GpuModel {
    GpuModel {
        name: name.to_string(),
        aliases: aliases.iter().map(|s| s.to_string()).collect(),
        memory_mib,
        name_gb,
        sms,
        mig,
        nvlink,
        opaque: false,
    }
}

impl Catalogue {
    /// Every model described by the reference.
    pub fn builtin() -> Self {
        let g8 = Some(&MIG_8_SLICE);
        #[rustfmt::skip]
        let models = vec![
            // A30: 4-slice geometry [V]; NVLink bridge pairs.
            model("A30-24GB", &["A30", "NVIDIA A30"], 24576, 24, 56, Some(&MIG_A30), NvLink::Bridge),
            // A100 40 GB: -lgipp [V] (MIGUG); 108 SMs, 98 usable in MIG (7 × 14).
            model("A100-40GB", &["A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB"], 40960, 40, 108, g8, NvLink::Switch),
            // A100 80 GB: same table as A100-40GB [V].
            model("A100-80GB", &["A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", "A100"], 81920, 80, 108, g8, NvLink::Switch),
            // A100 PCIe boards: the same MIG tables; NVLink bridges join pairs of boards, there is
            // no NVSwitch (reference §6) [V].
            model("A100-40GB-PCIE", &["A100-PCIE-40GB", "NVIDIA A100-PCIE-40GB"], 40960, 40, 108, g8, NvLink::Bridge),
            model("A100-80GB-PCIE", &["A100-PCIE-80GB", "NVIDIA A100 80GB PCIe"], 81920, 80, 108, g8, NvLink::Bridge),
            // H100 80 GB SXM5 (HGX, NVSwitch): -lgipp [V] from two transcripts.
            model("H100-80GB-SXM", &["H100-SXM5-80GB", "NVIDIA H100 80GB HBM3", "H100"], 81559, 80, 132, g8, NvLink::Switch),
            // H100 80 GB PCIe: same table [V]; 114 SMs; per-profile SM counts are [U].
            model("H100-80GB-PCIE", &["H100-PCIE-80GB"], 81559, 80, 114, g8, NvLink::Bridge),
            // H100 NVL 94 GB: -lgipp identical to the 8-slice table [V].
            model("H100-94GB-NVL", &["H100-NVL", "H100-94GB"], 95830, 94, 132, g8, NvLink::Bridge),
            // H200 141 GB SXM (PCI 0x2335, NVML name "NVIDIA H200"): profile IDs, slice counts,
            // instance counts and memory fractions of the MIG User Guide's H200 table [V]; the
            // placement table is [I] (the common one). `scripts/device-check.sh` compares it with
            // `nvidia-smi mig -lgipp` on an H200 that is in MIG mode.
            model("H200-141GB", &["H200", "H200-SXM5-141GB", "NVIDIA H200"], 143771, 141, 132, g8, NvLink::Switch),
            // H200 NVL (PCI 0x233B): the H200 tables and 143771 MiB [V]; bridges, not a switch
            // (reference §6). Whether it exposes 1g.35gb is [U]; the common table is kept.
            model("H200-141GB-NVL", &["H200-NVL", "NVIDIA H200 NVL"], 143771, 141, 132, g8, NvLink::Bridge),
            // H100 96 GB on GH200 (reference §2.5): names 1g.12gb … 7g.96gb [V], placements as
            // §2.0 [I]; NVML's MiB figure is [I] (96 GiB).
            model("GH200-96GB", &["GH200", "NVIDIA GH200 480GB"], 98304, 96, 132, g8, NvLink::None),
            // GH200 144 GB HBM3e (PCI 0x2348): names 1g.18gb … 7g.144gb [V]; MiB figure [I].
            model("GH200-144GB", &["NVIDIA GH200 144G HBM3e"], 147456, 144, 132, g8, NvLink::None),
            // H20 96 GB: grouped with H100-96GB/GH200 by mig-parted (same names) [V]; HGX board
            // with NVSwitch [I]; 78 SMs [I]; MiB figure [I].
            model("H20-96GB", &["H20", "NVIDIA H20"], 98304, 96, 78, g8, NvLink::Switch),
            // B200 180 GB: IDs, counts and fractions [V]; placement table [I]; SM count [I].
            model("B200-180GB", &["B200", "NVIDIA B200"], 184320, 180, 148, g8, NvLink::Switch),
            // GB200 (PCI 0x2941), 186 GB per GPU (MIGUG): names 1g.23gb, 1g.47gb, 2g.47gb,
            // 3g.93gb, 4g.93gb, 7g.186gb [V] (the older 1g.24gb/7g.189gb variant is not modelled);
            // NVLink Switch in the NVL72 rack [O]; placements as §2.0 [I]; MiB and SMs [I].
            model("GB200-186GB", &["GB200", "NVIDIA GB200"], 190464, 186, 148, g8, NvLink::Switch),
            // Non-MIG models.
            model("L40S", &["L40S-48GB", "NVIDIA L40S"], 46068, 48, 142, None, NvLink::None),
            // L40 and L4: no MIG, no NVLink; MiB figures as nvidia-smi shows them [I].
            model("L40", &["L40-48GB", "NVIDIA L40"], 46068, 48, 142, None, NvLink::None),
            model("L4", &["L4-24GB", "NVIDIA L4"], 23034, 24, 58, None, NvLink::None),
            model("T4", &["T4-16GB"], 15360, 16, 40, None, NvLink::None),
            model("P100", &["P100-16GB"], 16384, 16, 56, None, NvLink::None),
            model("V100M16", &["V100-16GB"], 16384, 16, 80, None, NvLink::None),
            model("V100M32", &["V100-32GB", "V100"], 32768, 32, 80, None, NvLink::None),
            model("A10", &["A10-24GB"], 23028, 24, 72, None, NvLink::None),
        ];
        Catalogue { models }
    }

    pub fn models(&self) -> impl Iterator<Item = (ModelId, &GpuModel)> {
        self.models.iter().enumerate().map(|(i, m)| (ModelId(i as u16), m))
    }

    pub fn get(&self, id: ModelId) -> &GpuModel {
        &self.models[id.0 as usize]
    }

    /// Looks a model up by name or alias, case-insensitively.
    pub fn find(&self, name: &str) -> Option<ModelId> {
        self.models
            .iter()
            .position(|m| m.matches_name(name))
            .map(|i| ModelId(i as u16))
    }

    /// Models whose name or alias equals `family` or starts with `family-` (so `h100` matches
    /// both H100 80 GB boards and the H100 NVL), for request whitelists such as `--model h100`.
    pub fn find_family(&self, family: &str) -> Vec<ModelId> {
        let f = family.to_ascii_lowercase();
        self.models()
            .filter(|(_, m)| {
                std::iter::once(&m.name).chain(m.aliases.iter()).any(|n| {
                    let n = n.to_ascii_lowercase();
                    n == f || n.starts_with(&format!("{f}-"))
                })
            })
            .map(|(id, _)| id)
            .collect()
    }

    /// Registers an opaque model (one the reference does not describe, such as the trace's `G2`)
    /// and returns its id; returns the existing id if the name is known.
    pub fn add_opaque(&mut self, name: &str, memory_mib: u32) -> ModelId {
        if let Some(id) = self.find(name) {
            return id;
        }
        self.models.push(GpuModel {
            name: name.to_string(),
            aliases: Vec::new(),
            memory_mib,
            name_gb: memory_mib.div_ceil(1024),
            sms: 0,
            mig: None,
            nvlink: NvLink::None,
            opaque: true,
        });
        ModelId((self.models.len() - 1) as u16)
    }

    pub fn len(&self) -> usize {
        self.models.len()
    }

    pub fn is_empty(&self) -> bool {
        self.models.is_empty()
    }
}

impl fmt::Display for ModelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "model#{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(c: &Catalogue, model: &str) -> Vec<String> {
        let m = c.get(c.find(model).unwrap());
        m.mig.unwrap().profiles.iter().map(|p| m.profile_name(p)).collect()
    }

    #[test]
    fn derived_names_match_the_reference() {
        let c = Catalogue::builtin();
        assert_eq!(
            names(&c, "A100-80GB"),
            [
                "1g.10gb",
                "1g.10gb+me",
                "1g.20gb",
                "2g.20gb",
                "3g.40gb",
                "4g.40gb",
                "7g.80gb"
            ]
        );
        assert_eq!(
            names(&c, "A100-40GB"),
            [
                "1g.5gb",
                "1g.5gb+me",
                "1g.10gb",
                "2g.10gb",
                "3g.20gb",
                "4g.20gb",
                "7g.40gb"
            ]
        );
        assert_eq!(
            names(&c, "H200"),
            [
                "1g.18gb",
                "1g.18gb+me",
                "1g.35gb",
                "2g.35gb",
                "3g.71gb",
                "4g.71gb",
                "7g.141gb"
            ]
        );
        assert_eq!(
            names(&c, "H100-94GB-NVL"),
            [
                "1g.12gb",
                "1g.12gb+me",
                "1g.24gb",
                "2g.24gb",
                "3g.47gb",
                "4g.47gb",
                "7g.94gb"
            ]
        );
        assert_eq!(
            names(&c, "B200"),
            [
                "1g.23gb",
                "1g.23gb+me",
                "1g.45gb",
                "2g.45gb",
                "3g.90gb",
                "4g.90gb",
                "7g.180gb"
            ]
        );
        assert_eq!(
            names(&c, "GH200-96GB"),
            [
                "1g.12gb",
                "1g.12gb+me",
                "1g.24gb",
                "2g.24gb",
                "3g.48gb",
                "4g.48gb",
                "7g.96gb"
            ]
        );
        assert_eq!(names(&c, "H20"), names(&c, "GH200-96GB"), "one mig-parted group");
        assert_eq!(
            names(&c, "GH200-144GB"),
            [
                "1g.18gb",
                "1g.18gb+me",
                "1g.36gb",
                "2g.36gb",
                "3g.72gb",
                "4g.72gb",
                "7g.144gb"
            ]
        );
        assert_eq!(names(&c, "H200-NVL"), names(&c, "H200"));
        assert_eq!(
            names(&c, "GB200"),
            [
                "1g.23gb",
                "1g.23gb+me",
                "1g.47gb",
                "2g.47gb",
                "3g.93gb",
                "4g.93gb",
                "7g.186gb"
            ]
        );
        assert_eq!(
            names(&c, "A30"),
            ["1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb"]
        );
    }

    #[test]
    fn profiles_are_found_by_name_or_id_and_units_follow_memory_slices() {
        let c = Catalogue::builtin();
        let a100 = c.get(c.find("a100-80gb").unwrap());
        let p3 = a100.find_profile("3g.40gb").unwrap();
        assert_eq!(p3.id, 9);
        assert_eq!(a100.profile_units(p3), GpuUnits::milli(500));
        assert_eq!(a100.find_profile("19").unwrap().mem_slices, 1);
        assert_eq!(
            a100.profile_units(a100.find_profile("1g.10gb").unwrap()),
            GpuUnits::milli(125)
        );
        assert!(a100.find_profile("3g.71gb").is_none());
        let a30 = c.get(c.find("A30").unwrap());
        assert_eq!(
            a30.profile_units(a30.find_profile("1g.6gb").unwrap()),
            GpuUnits::milli(250)
        );
        assert!(c.get(c.find("L40S").unwrap()).mig.is_none());
    }

    #[test]
    fn nvlink_kinds_and_models_without_mig() {
        let c = Catalogue::builtin();
        let get = |n: &str| c.get(c.find(n).unwrap_or_else(|| panic!("{n} missing")));
        // PCIe boards join pairs with NVLink bridges; HGX baseboards use NVSwitch.
        for pcie in ["A100-PCIE-40GB", "A100-PCIE-80GB", "H100-80GB-PCIE", "NVIDIA H200 NVL"] {
            assert_eq!(get(pcie).nvlink, NvLink::Bridge, "{pcie}");
        }
        for hgx in ["A100-SXM4-40GB", "A100-SXM4-80GB", "H100-80GB-SXM", "H200", "B200"] {
            assert_eq!(get(hgx).nvlink, NvLink::Switch, "{hgx}");
        }
        for plain in ["L4", "NVIDIA L40", "L40S"] {
            assert!(get(plain).mig.is_none(), "{plain} has no MIG");
            assert_eq!(get(plain).nvlink, NvLink::None);
        }
        // NVML device names (`nvmlDeviceGetName`) resolve too.
        assert_eq!(c.find("NVIDIA H200 NVL"), c.find("H200-141GB-NVL"));
        assert_eq!(c.find("NVIDIA GH200 480GB"), c.find("GH200-96GB"));
    }

    #[test]
    fn h200_follows_nvidias_tables() {
        let c = Catalogue::builtin();
        let id = c.find("NVIDIA H200").expect("the NVML name of the H200 SXM");
        assert_eq!(c.find("H200-141GB"), Some(id));
        assert_eq!(c.find("H200-SXM5-141GB"), Some(id));
        let m = c.get(id);
        assert_eq!((m.memory_mib, m.name_gb, m.nvlink), (143771, 141, NvLink::Switch));
        let geom = m.mig.unwrap();
        assert_eq!((geom.mem_slices, geom.sm_slices), (8, 7));
        // (name, profile ID, SM slices, memory slices, most instances, placement starts)
        let rows: Vec<(String, u32, u8, u8, u8, Vec<u8>)> = geom
            .profiles
            .iter()
            .map(|p| {
                (
                    m.profile_name(p),
                    p.id,
                    p.sm_slices,
                    p.mem_slices,
                    p.max_instances,
                    p.starts.to_vec(),
                )
            })
            .collect();
        let want: Vec<(String, u32, u8, u8, u8, Vec<u8>)> = [
            ("1g.18gb", 19, 1, 1, 7, &[0, 1, 2, 3, 4, 5, 6][..]),
            ("1g.18gb+me", 20, 1, 1, 1, &[0, 1, 2, 3, 4, 5, 6]),
            ("1g.35gb", 15, 1, 2, 4, &[0, 2, 4, 6]),
            ("2g.35gb", 14, 2, 2, 3, &[0, 2, 4]),
            ("3g.71gb", 9, 3, 4, 2, &[0, 4]),
            ("4g.71gb", 5, 4, 4, 1, &[0]),
            ("7g.141gb", 0, 7, 8, 1, &[0]),
        ]
        .iter()
        .map(|(n, id, g, mem, max, starts)| (n.to_string(), *id, *g, *mem, *max, starts.to_vec()))
        .collect();
        assert_eq!(rows, want);
        let units = |n: &str| m.profile_units(m.find_profile(n).unwrap());
        assert_eq!(units("1g.18gb"), GpuUnits::milli(125));
        assert_eq!(units("1g.35gb"), GpuUnits::milli(250));
        assert_eq!(units("3g.71gb"), GpuUnits::milli(500));
        assert_eq!(units("7g.141gb"), GpuUnits::milli(1000));
        assert_eq!(m.find_profile("1g.35gb").map(|p| p.id), Some(15));
    }

    #[test]
    fn families_and_opaque_models() {
        let mut c = Catalogue::builtin();
        let h100 = c.find_family("h100");
        assert_eq!(h100.len(), 3, "SXM, PCIe and NVL");
        let g2 = c.add_opaque("G2", 0);
        assert_eq!(c.add_opaque("g2", 0), g2);
        assert!(c.get(g2).opaque);
        assert_eq!(c.find("v100-32gb"), c.find("V100M32"));
    }
}
