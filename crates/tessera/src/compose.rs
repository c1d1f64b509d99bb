//! Composition: which store and which backend a server runs on is decided here, in the binary.
//! The server crate knows only the contracts (`tessera_store::Store`,
//! `tessera_backend::Backend`); this module opens the implementations the flags name — SQLite
//! in the data directory or PostgreSQL, the simulated backend (the `local` and Kubernetes
//! backends are made by `serve`) — and `tessera admin recover` opens the same store.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use tessera_backend_sim::{SimBackend, SimConfig, SimGpu, SimMode};
use tessera_model::Fleet;
use tessera_store::Store;
use tessera_store_postgres::PgStore;
use tessera_store_sqlite::SqliteStore;

/// The store the flags name: PostgreSQL at `database` (replicas share it), or SQLite in
/// `data_dir`, created on first start.
pub async fn open_store(data_dir: &Path, database: Option<&str>) -> anyhow::Result<Arc<dyn Store>> {
    match database {
        Some(url) => {
            let store = PgStore::connect(url).await.context("opening the PostgreSQL store")?;
            tracing::info!(database = %store.target(), "state in PostgreSQL");
            Ok(Arc::new(store))
        }
        None => {
            let store = SqliteStore::open_dir(data_dir)
                .await
                .with_context(|| format!("opening the store in {}", data_dir.display()))?;
            Ok(Arc::new(store))
        }
    }
}

/// The store a server already keeps (for `tessera admin recover`): a data directory without
/// the SQLite database is refused, not made into a new store.
pub async fn open_existing_store(data_dir: &Path, database: Option<&str>) -> anyhow::Result<Arc<dyn Store>> {
    if database.is_none() {
        let db = data_dir.join(tessera_store_sqlite::DB_FILE);
        if !db.exists() {
            bail!(
                "{} holds no Tessera store ({} is missing); give the --data-dir of the server",
                data_dir.display(),
                db.display()
            );
        }
    }
    open_store(data_dir, database).await
}

/// The simulated backend of `fleet`: `mode`, its MIG partitions taking `partition_ms` (default:
/// none in exact mode, 2 s as the GPU Operator's MIG manager in operator mode), telemetry every
/// `telemetry`.
pub fn sim_backend(fleet: &Fleet, mode: SimMode, partition_ms: Option<u64>, telemetry: Duration) -> Arc<SimBackend> {
    let partition_ms = partition_ms.unwrap_or(match mode {
        SimMode::Exact => 0,
        SimMode::Operator => 2000,
    });
    let cfg = SimConfig {
        mode,
        mig_partition_time: Duration::from_millis(partition_ms),
        telemetry_interval: telemetry,
        ..Default::default()
    };
    Arc::new(SimBackend::new(cfg, SimGpu::for_fleet(fleet)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn recovery_refuses_a_directory_without_a_store_and_creates_nothing() {
        let dir = tessera_testdb::TempDir::new("compose-no-store");
        let e = open_existing_store(&dir.0, None).await.err().expect("refused");
        assert!(format!("{e:#}").contains("holds no Tessera store"), "{e:#}");
        assert!(std::fs::read_dir(&dir.0).unwrap().next().is_none(), "nothing created");
        // Once a server made it, it opens.
        open_store(&dir.0, None).await.unwrap();
        open_existing_store(&dir.0, None).await.unwrap();
    }

    #[test]
    fn the_simulated_backend_takes_the_operators_partition_time_in_operator_mode() {
        let fleet = Fleet::seed();
        let t = Duration::from_millis(100);
        assert_eq!(
            sim_backend(&fleet, SimMode::Exact, None, t).config().mig_partition_time,
            Duration::ZERO
        );
        let op = sim_backend(&fleet, SimMode::Operator, None, t);
        assert_eq!(op.config().mig_partition_time, Duration::from_secs(2));
        assert_eq!(op.config().telemetry_interval, t);
        let given = sim_backend(&fleet, SimMode::Operator, Some(5), t);
        assert_eq!(given.config().mig_partition_time, Duration::from_millis(5));
    }
}
