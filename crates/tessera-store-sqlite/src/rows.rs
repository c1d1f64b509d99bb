//! SQLite's texts of the multi-row statements (`tessera_store_sql::rows`): one statement writes
//! many rows of a kind, so a lifecycle batch costs a few statements per kind of row instead of
//! one per row.
//!
//! The cost of a statement through sqlx is mostly fixed (a round trip to the connection's
//! worker thread, preparing or finding the prepared statement, stepping it), so writing rows
//! in groups is what makes a batch cheap. A group of `n` rows runs as statements of 64 rows
//! ([`PER_STATEMENT`]) and one more for the rest, whose text is made for the next of a few
//! fixed sizes ([`CHUNKS`]) and padded with rows of NULLs that the statement skips ([`text`]):
//! one statement for the rest, where splitting it greedily into 16, 4 and 1 rows took up to
//! nine. Each kind of statement has at most four texts: the seven kinds of a batch make 28,
//! which with the store's other statements stay within sqlx's per-connection cache of prepared
//! statements (100 texts): a connection prepares each text once.

use std::sync::Arc;

use tessera_store_sql::MultiRow;

use crate::SqliteStore;

/// The sizes of the statements' texts, largest first: a statement of fewer rows takes the
/// smallest text that holds them, padded ([`padded`]).
pub(crate) const CHUNKS: [usize; 4] = [64, 16, 4, 1];

/// How many rows one statement writes (the rest of a group, fewer, in one last statement).
pub(crate) const PER_STATEMENT: [usize; 1] = [CHUNKS[0]];

/// The size of the text a statement of `rows` rows runs with: the smallest of [`CHUNKS`] that
/// holds them.
pub(crate) fn padded(rows: usize) -> usize {
    CHUNKS
        .iter()
        .rev()
        .copied()
        .find(|&n| n >= rows)
        .expect("at most the largest chunk of rows per statement")
}

/// The most parameters one statement may take: SQLite's default `SQLITE_MAX_VARIABLE_NUMBER`
/// (32,766 since 3.32; PostgreSQL allows 65,535).
const MAX_PARAMETERS: usize = 32_766;

/// The text of `statement` for `rows` rows (one of [`CHUNKS`]): its head, then `rows`
/// parenthesised groups of one placeholder per column (`(?, ?), (?, ?)`), then its tail; made
/// once per size.
///
/// A statement may run with fewer rows than its text holds, the others all NULL ([`padded`]):
/// an update's rows join on their key, which a NULL matches nowhere; an insert reads its rows
/// as `SELECT * FROM (VALUES …) WHERE column1 IS NOT NULL`, which skips them (the first column
/// of every multi-row insert is a key, never NULL).
///
/// SQLite-specific: the placeholders are anonymous `?`, not the numbered `$1` the rest of the
/// store writes. sqlx asks SQLite for the name of each parameter it binds, and SQLite finds a
/// numbered parameter's name by a linear search, so binding `n` numbered parameters costs
/// `n²`: the 500 workload inserts of the batch test (47 columns each) took 108 ms with
/// numbered placeholders and 5 ms with anonymous ones. PostgreSQL has no such cost.
///
/// Panics when `rows` is not a chunk size or the largest chunk would exceed the database's
/// parameter limit (programming errors, caught by the tests that run every statement).
pub(crate) fn text(statement: &'static MultiRow, rows: usize) -> Arc<str> {
    assert!(CHUNKS.contains(&rows), "rows come in chunk sizes");
    statement.text::<SqliteStore>(rows, |m| {
        let columns = m.columns();
        assert!(
            columns * CHUNKS[0] <= MAX_PARAMETERS,
            "{} rows of {columns} parameters exceed the limit of {MAX_PARAMETERS}",
            CHUNKS[0]
        );
        let insert = m.head().starts_with("INSERT INTO ");
        let mut sql = String::from(m.head());
        if insert {
            sql.truncate(sql.len() - "VALUES ".len());
            sql.push_str("SELECT * FROM (VALUES ");
        }
        for r in 0..rows {
            sql.push_str(if r == 0 { "(" } else { ", (" });
            for c in 0..columns {
                if c > 0 {
                    sql.push_str(", ");
                }
                sql.push('?');
            }
            sql.push(')');
        }
        if insert {
            sql.push_str(") WHERE column1 IS NOT NULL");
        }
        sql.push_str(m.tail());
        sql
    })
}

/// Whether `sql` prepares: valid SQL on the store's schema, within the parameter limit.
#[cfg(test)]
pub(crate) async fn prepares(store: &SqliteStore, sql: Arc<str>) -> bool {
    use sqlx::{Executor, SqlSafeStr};
    (&store.pool)
        .prepare(sqlx::AssertSqlSafe(sql).into_sql_str())
        .await
        .is_ok()
}

/// The query plan of `sql` (its `detail` lines), for tests that check a statement finds its
/// rows by key instead of scanning a table.
#[cfg(test)]
pub(crate) async fn plan(store: &SqliteStore, sql: &str) -> Vec<String> {
    use sqlx::Row;
    sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")))
        .fetch_all(&store.pool)
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<String, _>("detail"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_hold_a_placeholder_per_column_and_row() {
        let m = Box::leak(Box::new(MultiRow::new(
            "INSERT INTO t (a, b) VALUES ",
            2,
            " RETURNING a",
        )));
        assert_eq!(
            &*text(m, 1),
            "INSERT INTO t (a, b) SELECT * FROM (VALUES (?, ?)) WHERE column1 IS NOT NULL RETURNING a"
        );
        assert_eq!(
            &*text(m, 4),
            "INSERT INTO t (a, b) SELECT * FROM (VALUES (?, ?), (?, ?), (?, ?), (?, ?)) WHERE column1 IS NOT NULL \
             RETURNING a"
        );
        let u = Box::leak(Box::new(MultiRow::new(
            "WITH v (id, x) AS (VALUES ",
            2,
            ") UPDATE t SET x = v.x FROM v WHERE t.id = v.id",
        )));
        assert_eq!(
            &*text(u, 4),
            "WITH v (id, x) AS (VALUES (?, ?), (?, ?), (?, ?), (?, ?)) UPDATE t SET x = v.x FROM v WHERE t.id = v.id"
        );
        assert_eq!(text(m, 64).matches('?').count(), 128);
        assert!(Arc::ptr_eq(&text(m, 4), &text(m, 4)), "a text is made once");
    }

    #[test]
    fn a_statement_takes_the_smallest_text_that_holds_its_rows() {
        let sizes: Vec<usize> = [1, 2, 4, 5, 16, 17, 63, 64].into_iter().map(padded).collect();
        assert_eq!(sizes, [1, 4, 4, 16, 16, 64, 64, 64]);
    }

    #[test]
    #[should_panic(expected = "exceed the limit")]
    fn a_statement_over_the_parameter_limit_is_refused() {
        let m = Box::leak(Box::new(MultiRow::new(
            "INSERT INTO t VALUES ",
            MAX_PARAMETERS / CHUNKS[0] + 1,
            "",
        )));
        text(m, 1);
    }
}
