//! cosign's key-based signatures: an ECDSA P-256 / SHA-256 signature (ASN.1 DER, base64) over
//! the bytes of a "simple signing" payload, a JSON document whose
//! `critical.image.docker-manifest-digest` names the signed manifest's digest and
//! `critical.identity.docker-reference` the repository it was signed for. The payload is the
//! signed bytes as stored, parsed only after the signature verifies.

use base64::Engine;
use p256::ecdsa::signature::Verifier;
use p256::ecdsa::{DerSignature, VerifyingKey};
use p256::pkcs8::DecodePublicKey;
use serde::Deserialize;

use crate::reference::{DOCKER_HUB, ImageRef};

/// A cosign public key: ECDSA P-256 in an SPKI `PUBLIC KEY` PEM block (`cosign.pub`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublicKey(VerifyingKey);

impl PublicKey {
    /// Parses a PEM `PUBLIC KEY` block holding a P-256 key.
    pub fn from_pem(pem: &str) -> Result<PublicKey, String> {
        VerifyingKey::from_public_key_pem(pem.trim())
            .map(PublicKey)
            .map_err(|e| format!("not a PEM `PUBLIC KEY` of an ECDSA P-256 key (cosign's default): {e}"))
    }
}

/// Why a signature does not admit an image.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the signature is not base64 DER ECDSA")]
    Malformed,
    #[error("the signature does not verify with any configured key")]
    NoKey,
    #[error("the signed payload is not a cosign simple-signing document: {0}")]
    Payload(String),
    #[error("the signature is for digest {signed}, not {actual}")]
    DigestMismatch { signed: String, actual: String },
    #[error("the signature is for repository {signed}, not {actual}")]
    IdentityMismatch { signed: String, actual: String },
}

#[derive(Deserialize)]
struct Payload {
    critical: Critical,
}

#[derive(Deserialize)]
struct Critical {
    identity: Identity,
    image: Image,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize)]
struct Identity {
    #[serde(rename = "docker-reference")]
    docker_reference: String,
}

#[derive(Deserialize)]
struct Image {
    #[serde(rename = "docker-manifest-digest")]
    docker_manifest_digest: String,
}

/// cosign names Docker Hub repositories `index.docker.io/…`.
fn same_repository(signed: &str, image: &ImageRef) -> bool {
    let name = image.name();
    if signed == name {
        return true;
    }
    image.registry == DOCKER_HUB && signed.strip_prefix("index.docker.io/") == Some(image.repository.as_str())
}

/// Verifies one signature layer: `signature_b64` over `payload` with one of `keys`, then that
/// the payload is for `image`'s repository and `digest`.
pub fn verify(
    keys: &[PublicKey],
    payload: &[u8],
    signature_b64: &str,
    image: &ImageRef,
    digest: &str,
) -> Result<(), SignatureError> {
    let der = base64::engine::general_purpose::STANDARD
        .decode(signature_b64.trim())
        .map_err(|_| SignatureError::Malformed)?;
    let sig = DerSignature::from_bytes(&der).map_err(|_| SignatureError::Malformed)?;
    if !keys.iter().any(|k| k.0.verify(payload, &sig).is_ok()) {
        return Err(SignatureError::NoKey);
    }
    let p: Payload = serde_json::from_slice(payload).map_err(|e| SignatureError::Payload(e.to_string()))?;
    if p.critical.kind != "cosign container image signature" {
        return Err(SignatureError::Payload(format!("type `{}`", p.critical.kind)));
    }
    if p.critical.image.docker_manifest_digest != digest {
        return Err(SignatureError::DigestMismatch {
            signed: p.critical.image.docker_manifest_digest,
            actual: digest.to_string(),
        });
    }
    // The docker-reference may carry a tag (older cosign versions); the repository is what counts.
    let signed = p.critical.identity.docker_reference;
    let signed_repo = match signed.rfind(':') {
        Some(i) if !signed[i..].contains('/') => &signed[..i],
        _ => signed.as_str(),
    };
    if !same_repository(signed_repo, image) {
        return Err(SignatureError::IdentityMismatch {
            signed,
            actual: image.name(),
        });
    }
    Ok(())
}

/// The payload cosign signs for `repository` at `digest` (for tests and fixtures).
pub fn simple_signing_payload(repository: &str, digest: &str) -> Vec<u8> {
    serde_json::json!({
        "critical": {
            "identity": {"docker-reference": repository},
            "image": {"docker-manifest-digest": digest},
            "type": "cosign container image signature"
        },
        "optional": null
    })
    .to_string()
    .into_bytes()
}
