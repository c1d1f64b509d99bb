//! Workloads asked for with the backend's own tools (on Kubernetes: a Pod or a Job's pods made
//! with `kubectl`), which still go through Tessera: the backend's admission hands the request
//! to the control plane for its checks ([`Backend::review_native`](crate::Backend::review_native)),
//! reports each such object once it exists ([`crate::BackendEvent::Submitted`]), and runs the
//! object itself once Tessera placed it (a [`crate::RunSpec`] with [`crate::RunSpec::native`]).

use serde::{Deserialize, Serialize};

/// The backend's own object a native workload is: what only the backend's API assigns (a
/// pod's namespace, name and UID), so that no tenant can make another object pass for it.
/// A gang (a Job whose pods run together) is its owner object (the Job) and its member pods.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NativeRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// A gang's pods, in gang order (node-share order): each one's name and UID. Empty: the
    /// object is one pod (`name`/`uid`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<(String, String)>,
}

impl NativeRef {
    /// One pod.
    pub fn pod(namespace: impl Into<String>, name: impl Into<String>, uid: impl Into<String>) -> NativeRef {
        NativeRef {
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
            members: Vec::new(),
        }
    }

    /// `namespace/name/uid` as stored, and for a gang `/pod=uid,pod=uid…` after it (none of
    /// the names or UIDs holds a `/`, a `=` or a `,`).
    pub fn to_record(&self) -> String {
        let mut s = format!("{}/{}/{}", self.namespace, self.name, self.uid);
        if !self.members.is_empty() {
            s.push('/');
            let members: Vec<String> = self.members.iter().map(|(n, u)| format!("{n}={u}")).collect();
            s.push_str(&members.join(","));
        }
        s
    }

    /// The inverse of [`NativeRef::to_record`].
    pub fn from_record(s: &str) -> Option<NativeRef> {
        let mut it = s.splitn(4, '/');
        let (namespace, name, uid) = (it.next()?, it.next()?, it.next()?);
        if namespace.is_empty() || name.is_empty() || uid.is_empty() {
            return None;
        }
        let mut members = Vec::new();
        if let Some(rest) = it.next() {
            for m in rest.split(',') {
                let (n, u) = m.split_once('=')?;
                if n.is_empty() || u.is_empty() || u.contains(['/', '=']) {
                    return None;
                }
                members.push((n.to_string(), u.to_string()));
            }
        }
        Some(NativeRef {
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
            members,
        })
    }

    /// Whether it is a gang of pods (a Job's) rather than one pod.
    pub fn is_gang(&self) -> bool {
        !self.members.is_empty()
    }
}

/// A native gang: the pods of one owner (a Job) that run together, all or none, one per
/// node-share.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NativeGang {
    /// How many pods (node-shares): the Job's parallelism.
    pub pods: u32,
    /// The topology level its pods must (or, `preferred`, should) share: `rack`, `pool` or a
    /// configured level.
    pub topology: Option<String>,
    pub preferred: bool,
}

/// The GPUs a native object asks for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NativeGpus {
    Whole(u32),
    Mig(String),
    /// A fraction of a shared GPU, in thousandths.
    Fraction(u32),
}

/// What a native object asks of Tessera, read by the backend from the object itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NativeAsk {
    /// The tenant project the object's namespace belongs to.
    pub tenant: String,
    pub project: String,
    /// The workload's name (the object's name, or its generated name's prefix).
    pub name: String,
    pub gpus: NativeGpus,
    pub model: Option<String>,
    pub pool: Option<String>,
    pub cpu_milli: Option<u64>,
    pub memory_mib: Option<u64>,
    /// The priority class it names (`None`: the default).
    pub priority: Option<String>,
    /// Every container image it runs (each is checked against the tenant's image policy).
    pub images: Vec<String>,
    /// Runs until it ends by itself (a batch job), rather than until stopped (a service).
    pub batch: bool,
    /// The pods of a Job that run together as one gang (`gpus` is then each pod's whole
    /// GPUs); `None`: one pod.
    #[serde(default)]
    pub gang: Option<NativeGang>,
}

/// What the backend's admission makes of a request to create an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NativeReview {
    /// Not Tessera's business (no GPUs, an exempt namespace, Tessera's own object): allowed
    /// as it is.
    Pass,
    /// Refused by the backend's own rules; the message says what to do instead.
    Refuse(String),
    /// A workload for the control plane to check (tenant, priority, image policy, shape).
    Ask(Box<NativeAsk>),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_keeps_a_pod_and_a_gang_and_refuses_what_is_not_one() {
        let pod = NativeRef::pod("t-a-ml", "train-x7", "u-1");
        assert_eq!(pod.to_record(), "t-a-ml/train-x7/u-1");
        assert_eq!(NativeRef::from_record(&pod.to_record()), Some(pod));
        let gang = NativeRef {
            members: vec![("train-a".into(), "u-2".into()), ("train-b".into(), "u-3".into())],
            ..NativeRef::pod("t-a-ml", "train", "u-job")
        };
        assert_eq!(gang.to_record(), "t-a-ml/train/u-job/train-a=u-2,train-b=u-3");
        let back = NativeRef::from_record(&gang.to_record()).unwrap();
        assert!(back.is_gang());
        assert_eq!(back, gang);
        for bad in [
            "",
            "ns/name",
            "ns//uid",
            "ns/name/uid/pod",
            "ns/name/uid/pod=",
            "ns/name/uid/=u",
        ] {
            assert_eq!(NativeRef::from_record(bad), None, "{bad}");
        }
    }
}
