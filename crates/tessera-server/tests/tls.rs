//! `serve` over TLS (rustls): a self-signed certificate made with openssl, trusted by the
//! client; plain HTTP on the same port is refused.

use std::process::Command;
use std::sync::Arc;

use crate::support::TempDir;
use tessera_backend_sim::{SimBackend, SimConfig, SimGpu};
use tessera_server::{ServerConfig, start};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_https() {
    let tmp = TempDir::new("tls");
    let dir = &tmp.0;
    let (ca, cert, key) = (dir.join("ca.pem"), dir.join("cert.pem"), dir.join("key.pem"));
    // A test CA and a server certificate for 127.0.0.1 signed by it.
    let script = format!(
        "set -e; cd {d}; \
         openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=tessera-test-ca -keyout ca.key -out ca.pem 2>/dev/null; \
         openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout key.pem -out server.csr 2>/dev/null; \
         printf 'subjectAltName=IP:127.0.0.1\\nbasicConstraints=CA:FALSE\\nextendedKeyUsage=serverAuth\\n' > ext.cnf; \
         openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 -extfile ext.cnf -out cert.pem 2>/dev/null",
        d = dir.display()
    );
    let ok = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .output()
        .expect("bash and openssl (Debian package openssl)");
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
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
