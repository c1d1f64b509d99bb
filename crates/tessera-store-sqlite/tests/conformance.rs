//! The `tessera-store` conformance suite against [`SqliteStore`], once on a fresh in-memory
//! database and once on a fresh file database per check.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use tessera_store_sqlite::SqliteStore;

mod in_memory {
    tessera_store::store_conformance_tests!(
        make = async { tessera_store_sqlite::SqliteStore::open_memory().await.unwrap() }
    );
}

mod on_disk {
    tessera_store::store_conformance_tests!(make = super::fresh_dir_store());
}

/// A store in a directory of its own under cargo's scratch space for integration tests. The
/// names repeat from run to run, so a run wipes what the previous one left instead of piling up.
async fn fresh_dir_store() -> SqliteStore {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("store-conformance")
        .join(NEXT.fetch_add(1, Ordering::Relaxed).to_string());
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => panic!("cannot clear {}: {e}", dir.display()),
    }
    SqliteStore::open_dir(&dir).await.unwrap()
}
