//! # tessera-imagepolicy
//!
//! A tenant's image policy and its enforcement at admission, apart from the rest of the
//! control plane so that the signature crypto and the registry client are built only here:
//!
//! * [`reference`]: container image references, normalised as Docker does (`ubuntu` is
//!   `docker.io/library/ubuntu:latest`), matched against allowed registry prefixes;
//! * [`cosign`]: cosign's key-based signature scheme (ECDSA P-256 over the "simple signing"
//!   payload, the payload naming the image's manifest digest and repository);
//! * [`registry`]: the OCI distribution API calls verification needs (tag → digest, the
//!   `sha256-<digest>.sig` signature manifest, its payload blobs);
//! * [`ImagePolicy::admit`]: the decision, with a typed [`Refusal`] naming the image and the
//!   rule it breaks. An admitted image that had to be verified comes back pinned to the
//!   digest that was verified (`name@sha256:…`), so that the tag cannot move between the check
//!   and the run.
//!
//! What is not here: where policies are stored (the store's `ImagePolicyRecord`), who may set
//! them (the API), and keyless (Fulcio/Rekor) verification.

pub mod cosign;
pub mod reference;
pub mod registry;

use std::fmt;

pub use cosign::PublicKey;
pub use reference::ImageRef;
pub use registry::{RegistryClient, RegistryError};

/// A tenant's rules for the images its workloads run.
#[derive(Clone, Debug, Default)]
pub struct ImagePolicy {
    /// Registry/repository prefixes an image must come from (normalised name, matched at a
    /// path boundary); empty: any registry.
    pub registries: Vec<String>,
    /// Public keys of which one must have signed the image (cosign); empty: no signature needed.
    pub keys: Vec<PublicKey>,
}

/// Why an image is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The image's repository is under none of the allowed prefixes.
    RegistryNotAllowed { image: String, allowed: Vec<String> },
    /// A signature is required and the registry holds none for the image's digest.
    SignatureMissing { image: String, digest: String },
    /// Signatures exist, and none verifies with a configured key for this image and digest.
    SignatureInvalid { image: String, digest: String, why: String },
}

impl Refusal {
    /// The reason code of the refusal (the API's problem type).
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::RegistryNotAllowed { .. } => "image-registry-not-allowed",
            Refusal::SignatureMissing { .. } => "image-signature-missing",
            Refusal::SignatureInvalid { .. } => "image-signature-invalid",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::RegistryNotAllowed { image, allowed } => write!(
                f,
                "image {image} is not from an allowed registry (the tenant's image policy allows {})",
                allowed.join(", ")
            ),
            Refusal::SignatureMissing { image, digest } => write!(
                f,
                "image {image} ({digest}) has no cosign signature in its registry, and the tenant's image policy requires one"
            ),
            Refusal::SignatureInvalid { image, digest, why } => write!(
                f,
                "image {image} ({digest}): no signature verifies with the tenant's cosign keys: {why}"
            ),
        }
    }
}

/// Why admission could not decide, or refused.
#[derive(Debug, thiserror::Error)]
pub enum Denied {
    /// The policy refuses the image.
    #[error("{0}")]
    Refused(Refusal),
    /// The image reference cannot be parsed, or names a tag the registry does not have.
    #[error("{0}")]
    BadImage(String),
    /// The registry could not be asked (network, server error): nothing was decided.
    #[error("{0}")]
    Unavailable(String),
}

impl ImagePolicy {
    /// Whether the policy checks anything.
    pub fn is_empty(&self) -> bool {
        self.registries.is_empty() && self.keys.is_empty()
    }

    /// Decides on `image`: `Ok` with the reference to run (digest-pinned when a signature was
    /// verified, unchanged otherwise), or why not. The registry is asked only when a signature
    /// is required.
    pub async fn admit(&self, image: &str, registry: &RegistryClient) -> Result<String, Denied> {
        if self.is_empty() {
            return Ok(image.to_string());
        }
        let r = ImageRef::parse(image).map_err(|e| Denied::BadImage(format!("image `{image}`: {e}")))?;
        if !self.registries.is_empty() && !self.registries.iter().any(|p| r.is_under(p)) {
            return Err(Denied::Refused(Refusal::RegistryNotAllowed {
                image: r.to_string(),
                allowed: self.registries.clone(),
            }));
        }
        if self.keys.is_empty() {
            return Ok(image.to_string());
        }
        let digest = match registry.resolve(&r).await {
            Ok(d) => d,
            Err(RegistryError::NotFound(what)) => {
                return Err(Denied::BadImage(format!("image {r}: {what}")));
            }
            Err(e) => return Err(Denied::Unavailable(format!("image {r}: {e}"))),
        };
        let signatures = match registry.signatures(&r, &digest).await {
            Ok(s) => s,
            Err(RegistryError::NotFound(_)) => vec![],
            Err(e) => return Err(Denied::Unavailable(format!("image {r}: {e}"))),
        };
        if signatures.is_empty() {
            return Err(Denied::Refused(Refusal::SignatureMissing {
                image: r.to_string(),
                digest,
            }));
        }
        let mut why = Vec::new();
        for s in &signatures {
            match cosign::verify(&self.keys, &s.payload, &s.signature, &r, &digest) {
                Ok(()) => return Ok(r.pinned(&digest)),
                Err(e) => why.push(e.to_string()),
            }
        }
        why.dedup();
        Err(Denied::Refused(Refusal::SignatureInvalid {
            image: r.to_string(),
            digest,
            why: why.join("; "),
        }))
    }
}
