//! The rules request values must follow, each stated once: the server checks requests with
//! them ([`Validate`]) and the OpenAPI document describes fields with them (the `schema_with`
//! functions below), so the document and the checks cannot drift apart.
//!
//! Lengths count Unicode scalar values (what JSON Schema's `minLength`/`maxLength` count), not
//! bytes. Names shown to other people refuse control characters and the bidirectional
//! formatting characters that can make a name read differently from what it is (U+202E …).

use utoipa::openapi::schema::{Object, ObjectBuilder, SchemaType, Type};
use utoipa::openapi::{KnownFormat, SchemaFormat};

/// A value that breaks a rule: the field (`shape.fraction`, `limit`) and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub field: String,
    pub message: String,
}

impl Violation {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Violation {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// A request type that checks its own values (after deserialisation, before any handler).
pub trait Validate {
    fn validate(&self) -> Result<(), Violation>;
}

/// Characters refused in names: C0 and C1 controls, DEL, and the bidirectional formatting
/// characters (Arabic letter mark, LRM/RLM, embeddings and overrides, isolates).
pub fn is_forbidden_in_names(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// The same set as a regular-expression character class (ECMA 262 and Python agree on it).
const FORBIDDEN_CLASS: &str = r"\u0000-\u001F\u007F-\u009F\u061C\u200E\u200F\u202A-\u202E\u2066-\u2069";

/// Characters that show nothing by themselves: white space (Unicode `White_Space`), the
/// refused characters above, and the format and filler characters that render as nothing
/// (soft hyphen, combining grapheme joiner, Hangul and Khmer fillers, Mongolian vowel
/// separator and variation selectors, zero-width space/non-joiner/joiner, word joiner and
/// invisible operators, the Braille blank, variation selectors, the byte-order mark). A name
/// needs at least one character that is not one of these.
pub fn is_invisible(c: char) -> bool {
    c.is_whitespace()
        || is_forbidden_in_names(c)
        || matches!(
            c,
            '\u{00AD}'
                | '\u{034F}'
                | '\u{115F}'
                | '\u{1160}'
                | '\u{17B4}'
                | '\u{17B5}'
                | '\u{180B}'..='\u{180E}'
                | '\u{200B}'..='\u{200D}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2800}'
                | '\u{3164}'
                | '\u{FE00}'..='\u{FE0F}'
                | '\u{FEFF}'
                | '\u{FFA0}'
        )
}

/// [`is_invisible`]'s characters beyond the refused ones, as a regular-expression character
/// class (ECMA 262 and Python agree on it).
const INVISIBLE_CLASS: &str = r"\u0009-\u000D\u0020\u0085\u00A0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000\u00AD\u034F\u115F\u1160\u17B4\u17B5\u180B-\u180E\u200B-\u200D\u2060-\u2064\u2800\u3164\uFE00-\uFE0F\uFEFF\uFFA0";

/// Free text shown to people: a workload's, token's or tenant's display name.
#[derive(Clone, Copy, Debug)]
pub struct TextRule {
    pub min_chars: usize,
    pub max_chars: usize,
}

/// Workload and token names.
pub const NAME: TextRule = TextRule {
    min_chars: 1,
    max_chars: 63,
};

/// A tenant's display name.
pub const DISPLAY_NAME: TextRule = TextRule {
    min_chars: 1,
    max_chars: 100,
};

impl TextRule {
    pub fn check(&self, field: &str, v: &str) -> Result<(), Violation> {
        let n = v.chars().count();
        if n < self.min_chars || n > self.max_chars {
            return Err(Violation::new(
                field,
                format!(
                    "{n} characters: a {field} has {}–{} characters",
                    self.min_chars, self.max_chars
                ),
            ));
        }
        if let Some(c) = v.chars().find(|c| is_forbidden_in_names(*c)) {
            return Err(Violation::new(
                field,
                format!(
                    "contains U+{:04X}: control and bidirectional formatting characters are not allowed",
                    c as u32
                ),
            ));
        }
        if v.chars().all(is_invisible) {
            return Err(Violation::new(
                field,
                format!(
                    "has no visible character: a {field} is more than spaces and invisible characters (such as U+200B)"
                ),
            ));
        }
        Ok(())
    }

    pub fn schema(&self, nullable: bool) -> Object {
        ObjectBuilder::new()
            .schema_type(string_type(nullable))
            .min_length(Some(self.min_chars))
            .max_length(Some(self.max_chars))
            .pattern(Some(format!(
                "^[^{FORBIDDEN_CLASS}]*[^{FORBIDDEN_CLASS}{INVISIBLE_CLASS}][^{FORBIDDEN_CLASS}]*$"
            )))
            .description(Some(format!(
                "{}–{} characters (Unicode); no control or bidirectional formatting characters",
                self.min_chars, self.max_chars
            )))
            .build()
    }
}

/// An image policy's lists: at most this many allowed registry prefixes …
pub const MAX_REGISTRIES: usize = 32;
/// … and cosign public keys.
pub const MAX_COSIGN_KEYS: usize = 8;
/// The longest registry prefix and PEM key.
pub const REGISTRY_PREFIX_MAX: usize = 255;
pub const COSIGN_KEY_MAX: usize = 4096;

/// The shape of an image policy's lists (what the server then parses is checked there: the
/// prefix's syntax, the key's PEM).
pub fn check_list(field: &str, v: &[String], max_items: usize, max_chars: usize) -> Result<(), Violation> {
    if v.len() > max_items {
        return Err(Violation::new(
            field,
            format!("{} entries: at most {max_items}", v.len()),
        ));
    }
    for (i, x) in v.iter().enumerate() {
        let n = x.chars().count();
        if n == 0 || n > max_chars {
            return Err(Violation::new(
                format!("{field}[{i}]"),
                format!("{n} characters: 1–{max_chars}"),
            ));
        }
    }
    Ok(())
}

/// The default grant of priority classes: what a tenant may use until the platform admin
/// grants it others.
pub const DEFAULT_PRIORITIES: [&str; 2] = ["standard", "opportunistic"];
/// The most priority classes one grant may name.
pub const MAX_PRIORITIES: usize = 16;

/// A grant of priority classes: 1–[`MAX_PRIORITIES`] class names (slugs), none twice. Whether
/// each is a class the server knows is the server's check.
pub fn check_priorities(field: &str, v: &[String]) -> Result<(), Violation> {
    if v.is_empty() {
        return Err(Violation::new(
            field,
            "grants no priority class: name at least one (or `null` for the default grant, standard and opportunistic)",
        ));
    }
    check_list(field, v, MAX_PRIORITIES, SLUG_MAX)?;
    for (i, p) in v.iter().enumerate() {
        check_slug(&format!("{field}[{i}]"), p)?;
        if v[..i].contains(p) {
            return Err(Violation::new(
                format!("{field}[{i}]"),
                format!("`{p}` is listed twice"),
            ));
        }
    }
    Ok(())
}

fn string_list_schema(max_items: usize, max_chars: usize, description: &str) -> utoipa::openapi::schema::Array {
    utoipa::openapi::schema::ArrayBuilder::new()
        .items(
            ObjectBuilder::new()
                .schema_type(SchemaType::Type(Type::String))
                .min_length(Some(1))
                .max_length(Some(max_chars)),
        )
        .max_items(Some(max_items))
        .description(Some(description.to_string()))
        .build()
}

/// The longest slug.
pub const SLUG_MAX: usize = 40;
/// The longest quota class of a declaration, in characters.
pub const QUOTA_CLASS_MAX: usize = 200;
const SLUG_PATTERN: &str = "^[a-z0-9][a-z0-9-]*$";

/// Tenant and project names: lower-case ASCII letters, digits and `-`, not starting with `-`.
pub fn check_slug(field: &str, v: &str) -> Result<(), Violation> {
    let ok = !v.is_empty()
        && v.len() <= SLUG_MAX
        && v.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && !v.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(Violation::new(
            field,
            format!("`{v}` is not a valid {field}: use 1–{SLUG_MAX} lower-case letters, digits and `-` (not first)"),
        ))
    }
}

fn slug_schema(nullable: bool) -> Object {
    ObjectBuilder::new()
        .schema_type(string_type(nullable))
        .min_length(Some(1))
        .max_length(Some(SLUG_MAX))
        .pattern(Some(SLUG_PATTERN))
        .description(Some(format!(
            "1–{SLUG_MAX} lower-case letters, digits and `-`, not starting with `-`"
        )))
        .build()
}

/// A whole number within bounds (both inclusive).
#[derive(Clone, Copy, Debug)]
pub struct IntRule {
    pub min: i64,
    pub max: i64,
    pub unit: &'static str,
}

/// Host CPU in milli-cores.
pub const CPU_MILLI: IntRule = IntRule {
    min: 500,
    max: 1_024_000,
    unit: "milli-CPUs",
};
/// Host memory in MiB (1 GiB to 16 TiB).
pub const MEMORY_MIB: IntRule = IntRule {
    min: 1024,
    max: 16 * 1024 * 1024,
    unit: "MiB",
};
/// A workload's run time or lease: up to 366 days.
pub const DURATION_S: IntRule = IntRule {
    min: 1,
    max: 366 * 86_400,
    unit: "s",
};
/// A token's lifetime: up to two years.
pub const EXPIRES_IN_S: IntRule = IntRule {
    min: 1,
    max: 2 * 366 * 86_400,
    unit: "s",
};
/// Whole GPUs per node (the largest nodes have 16).
pub const GPUS: IntRule = IntRule {
    min: 1,
    max: 16,
    unit: "GPUs",
};
/// Whole GPUs of one workload: on one node, or a gang across nodes.
pub const GANG_GPUS: IntRule = IntRule {
    min: 1,
    max: 65_536,
    unit: "GPUs",
};
/// Node-shares of one gang.
pub const NODES: IntRule = IntRule {
    min: 1,
    max: 4_096,
    unit: "nodes",
};

/// The longest topology level name (a Kubernetes label key: a 253-character prefix, `/`, and a
/// 63-character name).
pub const LEVEL_MAX: usize = 317;
/// [`check_level`] as a pattern (ASCII only, so its length in characters is its length in bytes).
const LEVEL_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9._/-]*$";

/// A topology level's name: a fleet level (`rack`, `block`), `pool`, or a Kubernetes label key
/// such as `nvidia.com/gpu.clique`.
pub fn check_level(field: &str, v: &str) -> Result<(), Violation> {
    let ok = !v.is_empty()
        && v.len() <= LEVEL_MAX
        && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-/".contains(&b))
        && v.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(Violation::new(
            field,
            format!(
                "`{v}`: a topology level is a name such as `rack`, `block`, `pool` or a label key such as `nvidia.com/gpu.clique`"
            ),
        ))
    }
}
/// A fraction of a time-shared GPU, in milli-GPU.
pub const FRACTION: IntRule = IntRule {
    min: 1,
    max: 999,
    unit: "milli-GPU",
};
/// GPU memory reserved with a fraction (up to 1 TiB).
pub const GPU_MEMORY_MIB: IntRule = IntRule {
    min: 1,
    max: 1024 * 1024,
    unit: "MiB",
};
/// A GPU's index on its node.
pub const GPU_INDEX: IntRule = IntRule {
    min: 0,
    max: GPUS.max - 1,
    unit: "",
};
/// An XID error code (NVIDIA's codes are small; 0 means none).
pub const XID: IntRule = IntRule {
    min: 0,
    max: u32::MAX as i64,
    unit: "",
};
/// Items per page.
pub const PAGE_LIMIT: IntRule = IntRule {
    min: 1,
    max: 500,
    unit: "items",
};
/// Identifiers and cursors that are numbers (workload ids, audit sequence numbers): the
/// database stores them as signed 64-bit integers.
pub const ID: IntRule = IntRule {
    min: 0,
    max: i64::MAX,
    unit: "",
};

impl IntRule {
    pub fn check(&self, field: &str, v: i64) -> Result<(), Violation> {
        if (self.min..=self.max).contains(&v) {
            Ok(())
        } else {
            Err(Violation::new(
                field,
                format!(
                    "{v}: {field} must be between {} and {} {}",
                    self.min, self.max, self.unit
                )
                .trim_end()
                .to_string(),
            ))
        }
    }

    /// [`check`](Self::check) for unsigned values (those above `i64::MAX` are out of range).
    pub fn check_u64(&self, field: &str, v: u64) -> Result<(), Violation> {
        match i64::try_from(v) {
            Ok(x) => self.check(field, x),
            Err(_) => Err(Violation::new(
                field,
                format!("{v}: {field} must be at most {} {}", self.max, self.unit),
            )),
        }
    }

    pub fn schema(&self, nullable: bool) -> Object {
        let t = if nullable {
            SchemaType::from_iter([Type::Integer, Type::Null])
        } else {
            SchemaType::Type(Type::Integer)
        };
        ObjectBuilder::new()
            .schema_type(t)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
            .minimum(Some(self.min as f64))
            .maximum(Some(self.max as f64))
            .build()
    }
}

/// A number of GPU units (thousandths of a GPU are the smallest step).
#[derive(Clone, Copy, Debug)]
pub struct UnitsRule {
    pub max: f64,
}

/// Quotas and budgets.
pub const UNITS: UnitsRule = UnitsRule { max: 10_000_000.0 };

impl UnitsRule {
    pub fn check(&self, field: &str, v: f64) -> Result<(), Violation> {
        if !v.is_finite() || !(0.0..=self.max).contains(&v) {
            return Err(Violation::new(
                field,
                format!("{v}: {field} must be between 0 and {}", self.max),
            ));
        }
        Ok(())
    }

    pub fn schema(&self, nullable: bool) -> Object {
        let t = if nullable {
            SchemaType::from_iter([Type::Number, Type::Null])
        } else {
            SchemaType::Type(Type::Number)
        };
        ObjectBuilder::new()
            .schema_type(t)
            .minimum(Some(0.0))
            .maximum(Some(self.max))
            .build()
    }
}

/// The `Idempotency-Key` header: 1–200 visible ASCII characters (no spaces, which proxies may
/// trim).
pub fn check_idempotency_key(v: &[u8]) -> Result<&str, Violation> {
    let ok = (1..=IDEMPOTENCY_KEY_MAX).contains(&v.len()) && v.iter().all(|b| (0x21..=0x7E).contains(b));
    if ok {
        Ok(std::str::from_utf8(v).expect("visible ASCII"))
    } else {
        Err(Violation::new(
            "Idempotency-Key",
            format!("must be 1–{IDEMPOTENCY_KEY_MAX} visible ASCII characters without spaces"),
        ))
    }
}

const IDEMPOTENCY_KEY_MAX: usize = 200;

/// [`check_idempotency_key`] as a schema.
fn idempotency_key_schema() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1))
        .max_length(Some(IDEMPOTENCY_KEY_MAX))
        .pattern(Some("^[!-~]+$"))
        .description(Some(format!(
            "1–{IDEMPOTENCY_KEY_MAX} visible ASCII characters, no spaces"
        )))
        .build()
}

fn string_type(nullable: bool) -> SchemaType {
    if nullable {
        SchemaType::from_iter([Type::String, Type::Null])
    } else {
        SchemaType::Type(Type::String)
    }
}

/// What [`crate::parse_time_ms`] reads (`[0-9]`, not `\\d`: Python's `\\d` takes any Unicode digit):
/// a year 0000–9999, a month 01–12, a day 01–31; a time of day 00:00:00–23:59:60 (a leap
/// second reads as :59) and an offset up to ±23:59. What a pattern does not say is
/// [`DATE_RULES_NOT_IN_PATTERN`].
pub const DATE_OR_TIME_PATTERN: &str = "^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])\
     (T([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)([.][0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9]))?$";

/// The date rules [`DATE_OR_TIME_PATTERN`] does not state (refused with 422).
pub const DATE_RULES_NOT_IN_PATTERN: &str = "a day the month does not have (`2023-02-29`, `2026-04-31`) \
     and an instant after 9999-12-30T22:00:00Z (the end of the representable times) are refused";

/// Dates accepted by reports: `YYYY-MM-DD` or an RFC 3339 time.
pub fn date_or_time_schema() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(DATE_OR_TIME_PATTERN))
        .description(Some(format!(
            "`YYYY-MM-DD` (UTC midnight) or an RFC 3339 time; {DATE_RULES_NOT_IN_PATTERN}"
        )))
        .build()
}

/// Host CPU a workload gets per GPU unit when it does not say (at least [`CPU_MILLI`]'s minimum).
pub const CPU_MILLI_PER_GPU_UNIT: u64 = 4000;
/// Host memory a workload gets per GPU unit when it does not say (at least [`MEMORY_MIB`]'s
/// minimum).
pub const MEMORY_MIB_PER_GPU_UNIT: u64 = 16 * 1024;
/// Items per page when a list request does not say.
pub const PAGE_DEFAULT: u32 = 100;

/// `schema_with` functions: the rule of each field (nullable where the field is optional in a
/// body), with the field's description, which `schema_with` would otherwise drop.
pub mod schema {
    use utoipa::openapi::schema::Object;

    use super::*;

    fn described(mut o: Object, d: impl Into<String>) -> Object {
        o.description = Some(d.into());
        o
    }

    pub fn name() -> Object {
        NAME.schema(false)
    }
    pub fn name_opt() -> Object {
        NAME.schema(true)
    }
    pub fn display_name_opt() -> Object {
        let o = DISPLAY_NAME.schema(true);
        let rule = o.description.clone().unwrap_or_default();
        described(o, format!("Shown to people (default: the name). {rule}"))
    }
    pub fn slug() -> Object {
        slug_schema(false)
    }
    pub fn slug_opt() -> Object {
        slug_schema(true)
    }
    pub fn cpu_milli_opt() -> Object {
        described(
            CPU_MILLI.schema(true),
            format!(
                "Host CPU in milli-cores, {}–{} (default {CPU_MILLI_PER_GPU_UNIT} per GPU unit, at least {})",
                CPU_MILLI.min, CPU_MILLI.max, CPU_MILLI.min
            ),
        )
    }
    pub fn memory_mib_opt() -> Object {
        described(
            MEMORY_MIB.schema(true),
            format!(
                "Host memory in MiB, {}–{} (default {MEMORY_MIB_PER_GPU_UNIT} per GPU unit, at least {})",
                MEMORY_MIB.min, MEMORY_MIB.max, MEMORY_MIB.min
            ),
        )
    }
    pub fn duration_s_opt() -> Object {
        described(
            DURATION_S.schema(true),
            format!(
                "Run time in seconds for batch work, a lease for services and interactive sessions: {}–{} (366 days). Absent: runs until cancelled.",
                DURATION_S.min, DURATION_S.max
            ),
        )
    }
    pub fn expires_in_s_opt() -> Object {
        described(
            EXPIRES_IN_S.schema(true),
            format!(
                "Lifetime in seconds, {}–{} (two years); absent: until revoked",
                EXPIRES_IN_S.min, EXPIRES_IN_S.max
            ),
        )
    }
    pub fn gpus_opt() -> Object {
        described(
            GPUS.schema(true),
            format!(
                "Whole GPUs on one node (and one NVLink domain), {}–{}",
                GPUS.min, GPUS.max
            ),
        )
    }
    pub fn gang_gpus_opt() -> Object {
        described(
            GANG_GPUS.schema(true),
            format!(
                "Whole GPUs, {}–{}: on one node when one node (NVLink domain) of the pool can hold them, else a multi-node gang of whole nodes",
                GANG_GPUS.min, GANG_GPUS.max
            ),
        )
    }
    pub fn gpus_per_node_opt() -> Object {
        described(
            GPUS.schema(true),
            format!(
                "A gang's GPUs per node-share, {}–{} (default: whole nodes)",
                GPUS.min, GPUS.max
            ),
        )
    }
    pub fn nodes_opt() -> Object {
        described(
            NODES.schema(true),
            format!("A gang's node-shares, {}–{}", NODES.min, NODES.max),
        )
    }
    pub fn topology_opt() -> Object {
        ObjectBuilder::new()
            .schema_type(string_type(true))
            .min_length(Some(1))
            .max_length(Some(LEVEL_MAX))
            .pattern(Some(LEVEL_PATTERN))
            .description(Some(
                "A gang's topology level (`rack`, `block`, `pool`, a label key such as `nvidia.com/gpu.clique`): \
                 by default the fewest racks possible, preferred",
            ))
            .build()
    }
    pub fn segment_opt() -> Object {
        described(
            GANG_GPUS.schema(true),
            "A gang in segments of this many GPUs, each within one rack (a multiple of the GPUs per node that divides the gang)".to_string(),
        )
    }
    pub fn fraction_opt() -> Object {
        described(
            FRACTION.schema(true),
            format!(
                "A fraction of a time-shared GPU in milli-GPU, {}–{}",
                FRACTION.min, FRACTION.max
            ),
        )
    }
    pub fn gpu_memory_mib_opt() -> Object {
        described(
            GPU_MEMORY_MIB.schema(true),
            format!(
                "With `fraction` only: GPU memory to reserve, MiB, {}–{}",
                GPU_MEMORY_MIB.min, GPU_MEMORY_MIB.max
            ),
        )
    }
    pub fn gpu_index() -> Object {
        described(GPU_INDEX.schema(false), "GPU index on the node")
    }
    pub fn xid() -> Object {
        described(
            XID.schema(false),
            "XID error code to report (e.g. 79: fallen off the bus, 48: double-bit ECC); 0 clears it",
        )
    }
    /// A query parameter (absent rather than null when not given).
    pub fn page_limit() -> Object {
        described(
            PAGE_LIMIT.schema(false),
            format!(
                "Items per page, {}–{} (default {PAGE_DEFAULT})",
                PAGE_LIMIT.min, PAGE_LIMIT.max
            ),
        )
    }
    pub fn id() -> Object {
        described(ID.schema(false), "The workload's id")
    }
    pub fn rollout_id() -> Object {
        described(ID.schema(false), "The rollout's id")
    }
    /// A query parameter: the `next_cursor` of the previous page, a number.
    pub fn cursor_id() -> Object {
        described(ID.schema(false), "The `next_cursor` of the previous page")
    }
    pub fn guaranteed() -> Object {
        described(
            UNITS.schema(false),
            "GPU units always available to the tenant, reclaimable from borrowers (thousandths at most)",
        )
    }
    pub fn quota_limit_opt() -> Object {
        described(
            UNITS.schema(true),
            "The most the tenant may hold, borrowing included (at least `guaranteed`); absent: no limit",
        )
    }
    pub fn budget_opt() -> Object {
        described(
            UNITS.schema(true),
            "GPU-unit-hours per calendar month; `null` removes the budget",
        )
    }
    pub fn idempotency_key() -> Object {
        idempotency_key_schema()
    }
    pub fn drain_after_opt() -> Object {
        ObjectBuilder::new()
            .schema_type(string_type(true))
            .enum_values(Some([Some("preempt"), Some("wait"), None]))
            .description(Some(
                "After the deadline: `preempt` what is left (needs `deadline_s`) or `wait` (default)",
            ))
            .build()
    }
    /// The query parameter `after` of a drain (absent rather than null when not given).
    pub fn drain_after() -> Object {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(["preempt", "wait"]))
            .description(Some(
                "After the deadline: `preempt` what is left (needs `deadline_s`; with the grace period, batch work is requeued) or `wait` (default)",
            ))
            .build()
    }
    /// A declared tenant's projects: names, each once.
    pub fn declared_projects() -> utoipa::openapi::schema::Array {
        utoipa::openapi::schema::ArrayBuilder::new()
            .items(slug_schema(false))
            .unique_items(true)
            .description(Some(
                "Projects the tenant must have (others it has are kept).".to_string(),
            ))
            .build()
    }
    /// A declared tenant's quotas: resource class (1–200 characters) → quota.
    pub fn declared_quotas() -> Object {
        ObjectBuilder::new()
            .schema_type(SchemaType::Type(Type::Object))
            .additional_properties(Some(utoipa::openapi::Ref::from_schema_name("SetQuota")))
            .property_names(Some(
                ObjectBuilder::new()
                    .schema_type(SchemaType::Type(Type::String))
                    .min_length(Some(1))
                    .max_length(Some(QUOTA_CLASS_MAX)),
            ))
            .description(Some(format!(
                "Resource class (1–{QUOTA_CLASS_MAX} characters) → quota: exactly the tenant's quotas (others it has are removed)."
            )))
            .build()
    }
    pub fn priorities_opt() -> utoipa::openapi::schema::Array {
        let mut a = string_list_schema(
            MAX_PRIORITIES,
            SLUG_MAX,
            "Priority class names granted to the tenant (each once); its workloads may ask only for these. \
             Absent or null: the default grant, `standard` and `opportunistic`.",
        );
        a.min_items = Some(1);
        a.unique_items = true;
        a.schema_type = utoipa::openapi::schema::SchemaType::from_iter([Type::Array, Type::Null]);
        a
    }
    pub fn registries() -> utoipa::openapi::schema::Array {
        string_list_schema(
            MAX_REGISTRIES,
            REGISTRY_PREFIX_MAX,
            "Registry/repository prefixes a workload's image must come from, matched on the normalised \
             reference at a path boundary (`registry.example.com/team-a/`; `ubuntu` is \
             `docker.io/library/ubuntu`); each starts with a registry host. Empty: any registry.",
        )
    }
    pub fn cosign_keys() -> utoipa::openapi::schema::Array {
        string_list_schema(
            MAX_COSIGN_KEYS,
            COSIGN_KEY_MAX,
            "cosign public keys (PEM `PUBLIC KEY`, ECDSA P-256, as `cosign.pub`): an image must carry a \
             signature in its registry that one of them verifies. Empty: no signature required.",
        )
    }
    pub fn date_or_time() -> Object {
        date_or_time_schema()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_count_characters_not_bytes() {
        let e63 = "é".repeat(63);
        assert_eq!(e63.len(), 126);
        assert!(NAME.check("name", &e63).is_ok(), "63 × é is 63 characters");
        assert!(NAME.check("name", &"é".repeat(64)).is_err());
        assert!(NAME.check("name", "").is_err());
        assert!(NAME.check("name", "résumé 训练 🚀").is_ok());
    }

    #[test]
    fn names_refuse_controls_and_bidi_overrides() {
        for bad in ["a\u{202E}b", "a\nb", "a\u{0085}b", "\u{2066}x", "a\u{200F}", "x\u{7F}"] {
            let e = NAME.check("name", bad).unwrap_err();
            assert_eq!(e.field, "name");
            assert!(e.message.contains("U+"), "{e}");
        }
    }

    #[test]
    fn names_need_a_visible_character() {
        for bad in [
            " ",
            "\u{200B}",
            "  \u{200B} ",
            "\u{3000}",
            "\u{FEFF}",
            "\u{2060}\u{00A0}",
            "\u{3164}",
        ] {
            let e = NAME.check("name", bad).unwrap_err();
            assert!(e.message.contains("no visible character"), "{bad:?}: {e}");
            assert!(DISPLAY_NAME.check("display_name", bad).is_err(), "{bad:?}");
        }
        for good in ["a", " a ", "\u{200B}x", "训", "🚀", "_", "-"] {
            assert!(NAME.check("name", good).is_ok(), "{good:?}");
        }
    }

    /// The code-point ranges of a character class written as `\uXXXX` and `\uXXXX-\uYYYY`.
    fn class_ranges(class: &str) -> Vec<(u32, u32)> {
        let mut out = Vec::new();
        let mut rest = class;
        while let Some(r) = rest.strip_prefix("\\u") {
            let lo = u32::from_str_radix(&r[..4], 16).unwrap();
            rest = &r[4..];
            let hi = match rest.strip_prefix("-\\u") {
                Some(r) => {
                    rest = &r[4..];
                    u32::from_str_radix(&r[..4], 16).unwrap()
                }
                None => lo,
            };
            out.push((lo, hi));
        }
        assert!(rest.is_empty(), "unparsed: {rest}");
        out
    }

    #[test]
    fn the_name_pattern_needs_what_the_check_calls_visible() {
        // Every BMP code point is in the pattern's invisible or refused classes exactly when
        // `is_invisible` says so.
        let ranges: Vec<(u32, u32)> = class_ranges(INVISIBLE_CLASS)
            .into_iter()
            .chain(class_ranges(FORBIDDEN_CLASS))
            .collect();
        for u in 0..=0xFFFFu32 {
            if let Some(c) = char::from_u32(u) {
                let listed = ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&u));
                assert_eq!(is_invisible(c), listed, "U+{u:04X}");
            }
        }
    }

    #[test]
    fn the_name_pattern_refuses_what_the_check_refuses() {
        // The schema's character class lists the same code points as `is_forbidden_in_names`.
        let listed = |c: char| {
            let u = c as u32;
            matches!(u, 0..=0x1F | 0x7F..=0x9F | 0x061C | 0x200E | 0x200F | 0x202A..=0x202E | 0x2066..=0x2069)
        };
        for u in (0..=0x3000u32).chain([0xFEFF, 0x1F680]) {
            if let Some(c) = char::from_u32(u) {
                assert_eq!(is_forbidden_in_names(c), listed(c), "U+{u:04X}");
            }
        }
    }

    #[test]
    fn slugs() {
        assert!(check_slug("tenant", "vision-2").is_ok());
        for bad in ["", "-x", "Vision", "a_b", "é", &"a".repeat(41)] {
            assert!(check_slug("tenant", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bounds_are_inclusive_and_u64_beyond_i64_is_out_of_range() {
        assert!(CPU_MILLI.check("cpu_milli", 500).is_ok());
        assert!(CPU_MILLI.check("cpu_milli", 0).is_err());
        assert!(DURATION_S.check("duration_s", i64::MAX).is_err());
        assert!(ID.check_u64("id", u64::MAX).is_err());
        assert!(ID.check_u64("id", i64::MAX as u64).is_ok());
    }

    #[test]
    fn the_idempotency_key_pattern_is_the_check() {
        // `^[!-~]+$`: every byte from 0x21 to 0x7E, nothing else.
        for b in 0u8..=255 {
            let in_pattern = (b'!'..=b'~').contains(&b);
            assert_eq!(check_idempotency_key(&[b]).is_ok(), in_pattern, "byte {b:#04x}");
        }
    }

    #[test]
    fn idempotency_keys() {
        assert_eq!(check_idempotency_key(b"retry-1").unwrap(), "retry-1");
        assert!(check_idempotency_key(b"").is_err());
        assert!(check_idempotency_key(b"a b").is_err());
        assert!(check_idempotency_key(&[b'a'; 201]).is_err());
    }
}
