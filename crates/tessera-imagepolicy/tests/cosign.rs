//! Signature verification, offline against a fixture made with OpenSSL (tests/fixtures), and
//! the whole admission path (tag → digest → signature manifest → payload → verify) against an
//! in-process OCI registry (axum on 127.0.0.1) serving manifests and blobs. Costs well under a
//! second once built.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use p256::ecdsa::signature::Signer;
use p256::ecdsa::{Signature, SigningKey};
use p256::pkcs8::{EncodePublicKey, LineEnding};
use sha2::{Digest, Sha256};
use tessera_imagepolicy::cosign::{SignatureError, simple_signing_payload, verify};
use tessera_imagepolicy::{Denied, ImagePolicy, ImageRef, PublicKey, Refusal, RegistryClient};

const FIXTURE_DIGEST: &str = "sha256:4d2c2e3f7f1b1b0f8a1d5b9e4a3c2f1e0d9c8b7a6f5e4d3c2b1a09f8e7d6c5b4";

fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

fn key(name: &str) -> PublicKey {
    PublicKey::from_pem(&fixture(name)).unwrap()
}

#[test]
fn the_openssl_fixture_verifies_offline_with_its_key() {
    let image = ImageRef::parse("registry.example.com/team-a/train:v1").unwrap();
    let payload = fixture("payload.json");
    let sig = fixture("payload.sig");
    assert_eq!(
        verify(
            &[key("other.pub"), key("cosign.pub")],
            payload.as_bytes(),
            &sig,
            &image,
            FIXTURE_DIGEST
        ),
        Ok(())
    );
}

#[test]
fn a_tampered_payload_or_a_wrong_key_does_not_verify() {
    let image = ImageRef::parse("registry.example.com/team-a/train:v1").unwrap();
    let payload = fixture("payload.json");
    let sig = fixture("payload.sig");
    let tampered = payload.replace("4d2c2e3f", "4d2c2e3e");
    let other = format!("sha256:{}", "4d2c2e3e".to_string() + &FIXTURE_DIGEST[15..]);
    assert_eq!(
        verify(&[key("cosign.pub")], tampered.as_bytes(), &sig, &image, &other),
        Err(SignatureError::NoKey)
    );
    assert_eq!(
        verify(&[key("other.pub")], payload.as_bytes(), &sig, &image, FIXTURE_DIGEST),
        Err(SignatureError::NoKey)
    );
    assert_eq!(
        verify(
            &[key("cosign.pub")],
            payload.as_bytes(),
            "bm90IGEgc2lnbmF0dXJl",
            &image,
            FIXTURE_DIGEST
        ),
        Err(SignatureError::Malformed)
    );
}

#[test]
fn a_valid_signature_for_another_digest_or_repository_is_refused() {
    let payload = fixture("payload.json");
    let sig = fixture("payload.sig");
    let image = ImageRef::parse("registry.example.com/team-a/train:v1").unwrap();
    let other_digest = format!("sha256:{}", "0".repeat(64));
    assert!(matches!(
        verify(&[key("cosign.pub")], payload.as_bytes(), &sig, &image, &other_digest),
        Err(SignatureError::DigestMismatch { .. })
    ));
    let elsewhere = ImageRef::parse("registry.example.com/team-b/train:v1").unwrap();
    assert!(matches!(
        verify(
            &[key("cosign.pub")],
            payload.as_bytes(),
            &sig,
            &elsewhere,
            FIXTURE_DIGEST
        ),
        Err(SignatureError::IdentityMismatch { .. })
    ));
}

#[test]
fn only_p256_public_key_pem_is_a_key() {
    assert!(PublicKey::from_pem(&fixture("cosign.pub")).is_ok());
    assert!(PublicKey::from_pem("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n").is_err());
    assert!(PublicKey::from_pem("ssh-ed25519 AAAAC3Nza").is_err());
}

/// A stored object: its media type and body.
type Object = (String, Vec<u8>);

/// A registry's content: path under `/v2/` → (media type, body); what was asked.
#[derive(Clone, Default)]
struct Registry {
    objects: Arc<Mutex<HashMap<String, Object>>>,
    requests: Arc<Mutex<Vec<String>>>,
}

fn digest_of(b: &[u8]) -> String {
    format!(
        "sha256:{}",
        Sha256::digest(b).iter().map(|x| format!("{x:02x}")).collect::<String>()
    )
}

impl Registry {
    fn put(&self, path: &str, media: &str, body: Vec<u8>) {
        self.objects.lock().unwrap().insert(path.into(), (media.into(), body));
    }

    /// Pushes an image manifest under `repo:tag`; returns its digest.
    fn push_image(&self, repo: &str, tag: &str, seed: &str) -> String {
        let m = serde_json::json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "size": 2, "digest": digest_of(seed.as_bytes())},
            "layers": []})
        .to_string()
        .into_bytes();
        let d = digest_of(&m);
        self.put(
            &format!("{repo}/manifests/{tag}"),
            "application/vnd.oci.image.manifest.v1+json",
            m.clone(),
        );
        self.put(
            &format!("{repo}/manifests/{d}"),
            "application/vnd.oci.image.manifest.v1+json",
            m,
        );
        d
    }

    /// Stores a cosign signature manifest for `digest` with one layer per (payload, signature).
    fn push_signatures(&self, repo: &str, digest: &str, sigs: &[(Vec<u8>, String)]) {
        let layers: Vec<_> = sigs
            .iter()
            .map(|(payload, sig)| {
                let d = digest_of(payload);
                self.put(
                    &format!("{repo}/blobs/{d}"),
                    "application/octet-stream",
                    payload.clone(),
                );
                serde_json::json!({"mediaType": "application/vnd.dev.cosign.simplesigning.v1+json",
                    "size": payload.len(), "digest": d,
                    "annotations": {"dev.cosignproject.cosign/signature": sig}})
            })
            .collect();
        let m = serde_json::json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "size": 2, "digest": digest_of(b"{}")},
            "layers": layers})
        .to_string()
        .into_bytes();
        let tag = format!("sha256-{}.sig", &digest[7..]);
        self.put(
            &format!("{repo}/manifests/{tag}"),
            "application/vnd.oci.image.manifest.v1+json",
            m,
        );
    }
}

async fn serve_v2(State(r): State<Registry>, Path(path): Path<String>) -> impl IntoResponse {
    r.requests.lock().unwrap().push(path.clone());
    let Some((media, body)) = r.objects.lock().unwrap().get(&path).cloned() else {
        return (StatusCode::NOT_FOUND, HeaderMap::new(), Vec::new());
    };
    let mut h = HeaderMap::new();
    h.insert(header::CONTENT_TYPE, media.parse().unwrap());
    if path.contains("/manifests/") {
        h.insert("docker-content-digest", digest_of(&body).parse().unwrap());
    }
    (StatusCode::OK, h, body)
}

async fn start_registry() -> (Registry, String) {
    let reg = Registry::default();
    let app = axum::Router::new()
        .route("/v2/{*path}", axum::routing::get(serve_v2))
        .with_state(reg.clone());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let host = format!("127.0.0.1:{}", l.local_addr().unwrap().port());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    (reg, host)
}

fn sign(k: &SigningKey, payload: &[u8]) -> String {
    use base64::Engine;
    let s: Signature = k.sign(payload);
    base64::engine::general_purpose::STANDARD.encode(s.to_der().as_bytes())
}

fn pem(k: &SigningKey) -> String {
    k.verifying_key().to_public_key_pem(LineEnding::LF).unwrap()
}

#[tokio::test]
async fn admission_resolves_the_tag_verifies_the_registry_signature_and_pins_the_digest() {
    let (reg, host) = start_registry().await;
    let signer = SigningKey::from_slice(&[7u8; 32]).unwrap();
    let stranger = SigningKey::from_slice(&[9u8; 32]).unwrap();
    let repo = "team-a/train";
    let name = format!("{host}/{repo}");
    let client = RegistryClient::default();
    let policy = ImagePolicy {
        registries: vec![format!("{host}/team-a/")],
        keys: vec![PublicKey::from_pem(&pem(&signer)).unwrap()],
    };

    // Signed with the configured key: admitted, pinned to the digest the tag had.
    let good = reg.push_image(repo, "v1", "good");
    let payload = simple_signing_payload(&name, &good);
    reg.push_signatures(repo, &good, &[(payload.clone(), sign(&signer, &payload))]);
    let admitted = policy.admit(&format!("{name}:v1"), &client).await.unwrap();
    assert_eq!(admitted, format!("{name}@{good}"));
    let asked = reg.requests.lock().unwrap().clone();
    assert!(asked.contains(&format!("{repo}/manifests/v1")), "{asked:?}");
    assert!(
        asked.contains(&format!("{repo}/manifests/sha256-{}.sig", &good[7..])),
        "{asked:?}"
    );
    assert!(
        asked.contains(&format!("{repo}/blobs/{}", digest_of(&payload))),
        "{asked:?}"
    );
    // By digest: the same, without resolving a tag.
    assert_eq!(
        policy.admit(&format!("{name}@{good}"), &client).await.unwrap(),
        format!("{name}@{good}")
    );

    // No signature at all.
    let unsigned = reg.push_image(repo, "unsigned", "unsigned");
    let e = policy.admit(&format!("{name}:unsigned"), &client).await.unwrap_err();
    assert!(
        matches!(&e, Denied::Refused(r @ Refusal::SignatureMissing { digest, .. }) if *digest == unsigned && r.code() == "image-signature-missing"),
        "{e:?}"
    );

    // Signed by someone else's key.
    let foreign = reg.push_image(repo, "foreign", "foreign");
    let p = simple_signing_payload(&name, &foreign);
    reg.push_signatures(repo, &foreign, &[(p.clone(), sign(&stranger, &p))]);
    let e = policy.admit(&format!("{name}:foreign"), &client).await.unwrap_err();
    assert!(
        matches!(&e, Denied::Refused(r @ Refusal::SignatureInvalid { .. }) if r.code() == "image-signature-invalid"),
        "{e:?}"
    );

    // A genuine signature of another image copied next to this one (digest mismatch).
    let copied = reg.push_image(repo, "copied", "copied");
    reg.push_signatures(repo, &copied, &[(payload.clone(), sign(&signer, &payload))]);
    let e = policy.admit(&format!("{name}:copied"), &client).await.unwrap_err();
    assert!(
        e.to_string().contains(&format!("signature is for digest {good}")),
        "{e}"
    );

    // The tag moved after signing: the new digest has no signature.
    reg.push_image(repo, "v1", "moved");
    let e = policy.admit(&format!("{name}:v1"), &client).await.unwrap_err();
    assert!(matches!(e, Denied::Refused(Refusal::SignatureMissing { .. })), "{e:?}");

    // An unknown tag names no image.
    let e = policy.admit(&format!("{name}:nope"), &client).await.unwrap_err();
    assert!(matches!(e, Denied::BadImage(_)), "{e:?}");

    // Outside the allowed registries: refused without asking any registry.
    let before = reg.requests.lock().unwrap().len();
    let e = policy
        .admit(&format!("{host}/team-b/train:v1"), &client)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Denied::Refused(r @ Refusal::RegistryNotAllowed { .. }) if r.code() == "image-registry-not-allowed"),
        "{e:?}"
    );
    assert!(e.to_string().contains(&format!("{host}/team-b/train:v1")), "{e}");
    let e = policy.admit("ubuntu:22.04", &client).await.unwrap_err();
    assert!(e.to_string().contains("docker.io/library/ubuntu:22.04"), "{e}");
    assert_eq!(reg.requests.lock().unwrap().len(), before);
}

#[tokio::test]
async fn an_unreachable_registry_decides_nothing() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    let policy = ImagePolicy {
        registries: vec![],
        keys: vec![PublicKey::from_pem(&fixture("cosign.pub")).unwrap()],
    };
    let e = policy
        .admit(&format!("127.0.0.1:{port}/a/b:1"), &RegistryClient::default())
        .await
        .unwrap_err();
    assert!(matches!(e, Denied::Unavailable(_)), "{e:?}");
}
