//! `serve` over TLS (rustls): a self-signed certificate made with openssl, trusted by the
//! client; plain HTTP on the same port is refused.

use std::sync::Arc;

use crate::support::TempDir;
use tessera_backend_sim::{SimBackend, SimConfig, SimGpu};
use tessera_server::{ServerConfig, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_https() {
    let tmp = TempDir::new("tls");
    let dir = &tmp.0;
    // A test CA and a server certificate for 127.0.0.1 signed by it.
    let (ca, cert, key) = tessera_testdb::test_certificates(dir, "tessera-test-ca");
    let cfg = ServerConfig {
        tls: Some((cert.clone(), key.clone())),
        ..ServerConfig::local(dir.join("data"))
    };
    let (r, _sim) = crate::support::serve(cfg, &crate::support::Parts::default()).await;
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&ca).unwrap()).unwrap();
    let https = reqwest::Client::builder().add_root_certificate(ca).build().unwrap();
    let resp = https
        .get(format!("https://{}/api/v1/pools", r.addr))
        .bearer_auth(r.admin_token.unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(
        reqwest::get(format!("http://{}/api/v1/health", r.addr)).await.is_err(),
        "plain HTTP is not served on a TLS port"
    );
    // A key that does not fit is refused at start with a clear line.
    let bad = ServerConfig {
        tls: Some((key.clone(), cert.clone())),
        ..ServerConfig::local(dir.join("data2"))
    };
    let store = crate::support::open_store(&bad.data_dir, None).await;
    let sim = Arc::new(SimBackend::new(SimConfig::default(), SimGpu::for_fleet(&bad.fleet)));
    let e = start(bad, store, sim)
        .await
        .err()
        .expect("swapped files are refused")
        .to_string();
    assert!(e.contains("--tls-"), "{e}");
}
