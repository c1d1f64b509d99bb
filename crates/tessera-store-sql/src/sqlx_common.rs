//! What both drivers, being sqlx drivers, share whatever their database: how the errors sqlx
//! raises the same way for every database are classified, and the refusal of a schema a newer
//! Tessera upgraded. Only sqlx's core is used here; each store crate brings its database.

use tessera_store::{Result, StoreError};

use crate::DbError;

/// A database error that says nothing the driver's database classifies on its own: a row or
/// column that does not decode is `Corrupt`; anything else (timeouts, connections lost, the
/// server shutting down, serialisation failures, deadlocks, database errors the driver did not
/// claim) is `Unavailable`, an operation that may succeed if retried. A driver matches its own
/// database's codes first and hands the rest here.
pub fn classify_common(e: sqlx::Error) -> DbError {
    match &e {
        sqlx::Error::RowNotFound
        | sqlx::Error::TypeNotFound { .. }
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_) => DbError::Store(StoreError::Corrupt(e.to_string())),
        _ => DbError::Store(StoreError::Unavailable(e.to_string())),
    }
}

/// The versions of the migrations applied to a database, in order (sqlx's own table).
pub const APPLIED_VERSIONS: &str = "SELECT version FROM _sqlx_migrations ORDER BY version";

/// Refuses (`Incompatible`) a database a newer Tessera upgraded: one whose sqlx migration table
/// (there when `migrated`: a fresh database has none) lists versions `migrator` does not know
/// (see [`unknown_versions`]). `classify` is the driver's classification of its errors.
pub async fn check_applied<DB>(
    pool: &sqlx::Pool<DB>,
    migrated: bool,
    migrator: &sqlx::migrate::Migrator,
    classify: fn(sqlx::Error) -> DbError,
) -> Result<()>
where
    DB: sqlx::Database,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    (i64,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    if !migrated {
        return Ok(());
    }
    let applied: Vec<i64> = sqlx::query_scalar(APPLIED_VERSIONS)
        .fetch_all(pool)
        .await
        .map_err(|e| crate::db(classify(e)))?;
    unknown_versions(migrator, &applied)
}

/// `Incompatible` naming the applied versions `migrator` does not know, if any: a newer Tessera
/// upgraded the database, and this one would misread what it wrote.
pub fn unknown_versions(migrator: &sqlx::migrate::Migrator, applied: &[i64]) -> Result<()> {
    let known: Vec<i64> = migrator.iter().map(|m| m.version).collect();
    let unknown: Vec<i64> = applied.iter().copied().filter(|v| !known.contains(v)).collect();
    if unknown.is_empty() {
        return Ok(());
    }
    Err(StoreError::Incompatible(format!(
        "the database's schema has version {} applied, which this Tessera ({}) does not know (it knows up \
         to {}): a newer Tessera upgraded it; run that version or a newer one",
        unknown.iter().map(i64::to_string).collect::<Vec<_>>().join(", "),
        env!("CARGO_PKG_VERSION"),
        known.iter().max().copied().unwrap_or(0)
    )))
}
