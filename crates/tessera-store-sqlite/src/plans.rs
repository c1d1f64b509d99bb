//! SQLite's view of the statements it shares with the PostgreSQL store (`tessera-store-sql`):
//! every multi-row statement prepares at each chunk size (within SQLite's limits on parameters
//! and expression depth), and the updates and closes search by their keys and indexes instead
//! of scanning.

use tessera_store_sql::{Driver, audit, ledger, workloads};

use crate::{SqliteStore, rows};

#[tokio::test]
async fn the_audit_insert_prepares() {
    let store = SqliteStore::open_memory().await.unwrap();
    for n in rows::CHUNKS {
        assert!(rows::prepares(&store, rows::text(&audit::INSERT, n)).await);
    }
}

/// Both statements prepare, and a close finds each interval by its key, never by a scan.
#[tokio::test]
async fn multi_row_statements_prepare_and_closes_search_by_key() {
    let store = SqliteStore::open_memory().await.unwrap();
    for n in rows::CHUNKS {
        assert!(rows::prepares(&store, rows::text(&ledger::OPEN, n)).await);
        let plan = rows::plan(&store, &rows::text(&ledger::CLOSE, n)).await;
        assert!(
            plan.iter()
                .any(|p| p.starts_with("SEARCH usage_intervals USING") && p.ends_with("(workload_id=? AND seq=?)")),
            "{plan:?}"
        );
        assert!(!plan.iter().any(|p| p.starts_with("SCAN usage_intervals")), "{plan:?}");
    }
}

/// The month's closed use reads the intervals that ended in it, never the whole ledger.
#[tokio::test]
async fn closed_usage_searches_by_end() {
    let store = SqliteStore::open_memory().await.unwrap();
    let plan = rows::plan(&store, SqliteStore::CLOSED_USAGE).await;
    assert!(
        plan.iter()
            .any(|p| p.starts_with("SEARCH usage_intervals USING INDEX usage_ended (ended_at>?)")),
        "{plan:?}"
    );
}

/// Every multi-row statement of workloads prepares (so its text is valid SQL within the
/// parameter limit), and the update finds each workload by its key, never by a scan.
#[tokio::test]
async fn multi_row_statements_prepare_and_updates_search_by_id() {
    let store = SqliteStore::open_memory().await.unwrap();
    for statement in [
        &workloads::INSERT,
        &workloads::UPDATE,
        &workloads::INSERT_EVENTS,
        &workloads::INSERT_KEYS,
    ] {
        for n in rows::CHUNKS {
            assert!(
                rows::prepares(&store, rows::text(statement, n)).await,
                "{}",
                rows::text(statement, n)
            );
        }
    }
    for n in rows::CHUNKS {
        let plan = rows::plan(&store, &rows::text(&workloads::UPDATE, n)).await;
        assert!(
            plan.iter()
                .any(|p| p.starts_with("SEARCH workloads USING") && p.ends_with("(id=?)")),
            "{plan:?}"
        );
        assert!(!plan.iter().any(|p| p.starts_with("SCAN workloads")), "{plan:?}");
    }
}
