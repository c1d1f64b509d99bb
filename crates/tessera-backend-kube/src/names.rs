//! Names and labels Tessera puts on cluster objects: the namespace of a tenant's project, pod
//! names, the labels that let a restarted Tessera find its pods and namespaces again.

use std::collections::BTreeMap;

use tessera_backend::RunSpec;

/// Tessera's workload ID on a pod.
pub const LABEL_WORKLOAD: &str = "tessera.io/workload";
pub const LABEL_TENANT: &str = "tessera.io/tenant";
pub const LABEL_PROJECT: &str = "tessera.io/project";
/// Which attempt of the workload the pod runs (0 for the first; a requeued workload's next
/// placement is the next attempt, with pods of its own names).
pub const LABEL_ATTEMPT: &str = "tessera.io/attempt";
/// A gang's pods: the pod's index in the gang and the gang's size.
pub const LABEL_GANG_INDEX: &str = "tessera.io/gang-index";
pub const LABEL_GANG_SIZE: &str = "tessera.io/gang-size";
/// `app.kubernetes.io/managed-by: tessera` on everything Tessera creates.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "tessera";
/// The node the engine chose, on the pod (the binding makes it `spec.nodeName`).
pub const ANNOTATION_NODE: &str = "tessera.io/node";
pub const ANNOTATION_NAME: &str = "tessera.io/name";
/// The field manager of every server-side apply.
pub const FIELD_MANAGER: &str = "tessera";

/// A DNS-1123 label (lower case alphanumerics and `-`, at most 63 characters); a name that had to
/// be shortened keeps a hash of the original so two long names stay apart.
pub fn dns_label(raw: &str) -> String {
    let mut s: String = raw
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    while s.contains("--") {
        s = s.replace("--", "-");
    }
    let s = s.trim_matches('-').to_string();
    if s.len() <= 63 && !s.is_empty() {
        return s;
    }
    // FNV-1a of the raw name.
    let mut h: u64 = 0xcbf29ce484222325;
    for b in raw.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    let keep: String = s.chars().take(54).collect();
    format!("{}-{:08x}", keep.trim_end_matches('-'), h as u32)
}

/// The namespace of a tenant's project. `<prefix><tenant>-<project>` when both names are plain
/// (letters and digits only) and it fits: such a name can come from one pair only. Any other
/// pair — a `-` in a name (`a-b`/`c` and `a`/`b-c` would both give `…a-b-c`), or a name too
/// long — gets its sanitised, shortened name, `--` and 10 hex digits of the SHA-256 of the
/// pair: plain names never hold `--` after the prefix, so the two forms cannot meet, and two
/// hashed names meet only if their hashes do (the tenancy sync also refuses a namespace that
/// carries another pair's labels).
pub fn namespace(prefix: &str, tenant: &str, project: &str) -> String {
    let plain_part = |x: &str| !x.is_empty() && x.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    let plain = format!("{prefix}{tenant}-{project}");
    if plain_part(tenant) && plain_part(project) && dns_label(&plain) == plain {
        return plain;
    }
    use sha2::{Digest, Sha256};
    let h = Sha256::digest(format!("{prefix}\0{tenant}\0{project}").as_bytes());
    let hex: String = h.iter().take(5).map(|b| format!("{b:02x}")).collect();
    let stem = dns_label(&plain);
    let stem: String = stem.chars().take(63 - 12).collect();
    format!("{}--{hex}", stem.trim_end_matches('-'))
}

/// The pod of workload `id`.
pub fn pod_name(id: u64) -> String {
    format!("tessera-{id}")
}

/// The pod of node-share `index` of a workload with `size` shares: `tessera-<id>` for a
/// workload on one node, `tessera-<id>-<index>` for the pods of a multi-node gang.
pub fn gang_pod_name(id: u64, index: usize, size: usize) -> String {
    if size <= 1 {
        pod_name(id)
    } else {
        format!("tessera-{id}-{index}")
    }
}

/// The pod of node-share `index` of attempt `attempt` of a workload with `size` shares: the
/// first attempt's pods are named as [`gang_pod_name`] says; a later attempt's carry `-r<attempt>`
/// after the ID (`tessera-7-r2`, `tessera-7-r2-0`), so that a requeued workload never waits for
/// its old pod's name while that pod terminates.
pub fn attempt_pod_name(id: u64, attempt: u32, index: usize, size: usize) -> String {
    if attempt == 0 {
        return gang_pod_name(id, index, size);
    }
    if size <= 1 {
        format!("tessera-{id}-r{attempt}")
    } else {
        format!("tessera-{id}-r{attempt}-{index}")
    }
}

/// Whether `name` is a pod name Tessera gives workload `id` (any attempt, any share).
pub fn is_pod_name_of(name: &str, id: u64) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let Some(rest) = name.strip_prefix(&format!("tessera-{id}")) else {
        return false;
    };
    if rest.is_empty() {
        return true;
    }
    let Some(rest) = rest.strip_prefix('-') else {
        return false;
    };
    match rest.strip_prefix('r') {
        Some(r) => match r.split_once('-') {
            Some((attempt, index)) => digits(attempt) && digits(index),
            None => digits(r),
        },
        None => digits(rest),
    }
}

/// The headless Service of a multi-node gang (`tessera-<id>`): with each pod's `hostname` and
/// `subdomain` it gives the pods the DNS names `tessera-<id>-<index>.tessera-<id>`.
pub fn gang_service(id: u64) -> String {
    pod_name(id)
}

/// The headless Service of attempt `attempt` of a multi-node gang (`tessera-<id>` for the
/// first, `tessera-<id>-r<attempt>` after a requeue: the old one goes with its old pods).
pub fn attempt_service(id: u64, attempt: u32) -> String {
    attempt_pod_name(id, attempt, 0, 1)
}

/// The labels of a workload's pod (node-share `index`, first attempt).
pub fn workload_labels(spec: &RunSpec, index: usize) -> BTreeMap<String, String> {
    attempt_labels(spec, 0, index)
}

/// The labels of a workload's pod (node-share `index` of attempt `attempt`).
pub fn attempt_labels(spec: &RunSpec, attempt: u32, index: usize) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_ATTEMPT.to_string(), attempt.to_string()),
        (LABEL_WORKLOAD.to_string(), spec.id.to_string()),
        (LABEL_TENANT.to_string(), label_value(&spec.tenant)),
        (LABEL_PROJECT.to_string(), label_value(&spec.project)),
        (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
        (LABEL_GANG_INDEX.to_string(), index.to_string()),
        (LABEL_GANG_SIZE.to_string(), spec.gang_size().to_string()),
    ])
}

/// A label value (at most 63 characters of `[A-Za-z0-9._-]`, alphanumeric at both ends).
pub fn label_value(raw: &str) -> String {
    let s: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    s.trim_matches(|c: char| !c.is_ascii_alphanumeric()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_attempt_has_pod_names_of_its_own() {
        assert_eq!(attempt_pod_name(7, 0, 0, 1), "tessera-7");
        assert_eq!(attempt_pod_name(7, 0, 1, 4), "tessera-7-1");
        assert_eq!(attempt_pod_name(7, 2, 0, 1), "tessera-7-r2");
        assert_eq!(attempt_pod_name(7, 2, 3, 4), "tessera-7-r2-3");
        for n in ["tessera-7", "tessera-7-1", "tessera-7-r2", "tessera-7-r2-3"] {
            assert!(is_pod_name_of(n, 7), "{n}");
            assert!(!is_pod_name_of(n, 70) && !is_pod_name_of(n, 8), "{n}");
        }
        for n in ["tessera-70", "tessera-7-x", "spoof", "tessera-7-r", "tessera-7-rr-1"] {
            assert!(!is_pod_name_of(n, 7), "{n}");
        }
    }

    #[test]
    fn namespaces_are_dns_labels() {
        assert_eq!(namespace("tessera-", "acme", "vision"), "tessera-acme-vision");
        // A name that had to be sanitised keeps a hash of the pair.
        let sanitised = namespace("t-", "Acme Corp", "ML_1");
        assert!(
            sanitised.starts_with("t-acme-corp-ml-1--") && sanitised.len() == 28,
            "{sanitised}"
        );
        let long = namespace("tessera-", &"a".repeat(40), &"b".repeat(40));
        assert!(long.len() <= 63, "{long}");
        let other = namespace("tessera-", &"a".repeat(40), &"b".repeat(41));
        assert_ne!(long, other, "shortened names keep a hash of the original");
    }

    #[test]
    fn pairs_that_would_join_to_one_name_get_different_namespaces() {
        let a = namespace("tessera-", "a-b", "c");
        let b = namespace("tessera-", "a", "b-c");
        assert_ne!(a, b);
        assert!(
            a.starts_with("tessera-a-b-c--") && b.starts_with("tessera-a-b-c--"),
            "{a} {b}"
        );
        // Stable across releases and processes (a restarted Tessera finds the same namespace).
        assert_eq!(namespace("tessera-", "a-b", "c"), a);
        // A plain pair cannot take a hashed name: no `--` after the prefix.
        let tricky = namespace("tessera-", "a", &a["tessera-a-".len()..]);
        assert_ne!(tricky, a);
        for n in [&a, &b, &tricky, &namespace("t-", &"x-".repeat(20), &"y".repeat(40))] {
            assert!(n.len() <= 63, "{n}");
            assert!(
                n.bytes()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-'),
                "{n}"
            );
            assert!(!n.starts_with('-') && !n.ends_with('-'), "{n}");
        }
    }
}
