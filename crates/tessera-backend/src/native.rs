//! Workloads asked for with the backend's own tools (on Kubernetes: a Pod or a Job's pods made
//! with `kubectl`), which still go through Tessera: the backend's admission hands the request
//! to the control plane for its checks ([`Backend::review_native`](crate::Backend::review_native)),
//! reports each such object once it exists ([`crate::BackendEvent::Submitted`]), and runs the
//! object itself once Tessera placed it (a [`crate::RunSpec`] with [`crate::RunSpec::native`]).

use serde::{Deserialize, Serialize};

/// The backend's own object a native workload is: what only the backend's API assigns (a
/// pod's namespace, name and UID), so that no tenant can make another object pass for it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NativeRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl NativeRef {
    /// `namespace/name/uid`, as stored (none of the three holds a `/`).
    pub fn to_record(&self) -> String {
        format!("{}/{}/{}", self.namespace, self.name, self.uid)
    }

    /// The inverse of [`NativeRef::to_record`].
    pub fn from_record(s: &str) -> Option<NativeRef> {
        let mut it = s.splitn(3, '/');
        let (namespace, name, uid) = (it.next()?, it.next()?, it.next()?);
        if namespace.is_empty() || name.is_empty() || uid.is_empty() || uid.contains('/') {
            return None;
        }
        Some(NativeRef {
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
        })
    }
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
