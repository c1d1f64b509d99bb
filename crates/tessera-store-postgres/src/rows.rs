//! Multi-row statements: one statement writes many rows of a kind, so a lifecycle batch costs
//! a few statements per kind of row instead of one per row.
//!
//! The cost of a statement through sqlx is mostly fixed (a round trip to the connection's
//! worker thread, preparing or finding the prepared statement, stepping it), so writing rows
//! in groups is what makes a batch cheap. The group sizes are fixed ([`CHUNKS`]): a group of
//! `n` rows runs as greedy chunks of 64, 16, 4 and 1 rows, so each kind of statement has at
//! most four SQL texts: the seven kinds of a batch make 28, which with the store's other
//! statements stay within sqlx's per-connection cache of prepared statements (100 texts): a
//! connection prepares each text once.

use sqlx::Postgres;
use sqlx::postgres::{PgArguments, PgConnection};
use tessera_store::{Result, StoreError};

pub(crate) type Query<'q> = sqlx::query::Query<'q, Postgres, PgArguments>;

/// Rows per statement, largest first; the last must be 1 so that any number of rows splits.
pub(crate) const CHUNKS: [usize; 4] = [64, 16, 4, 1];

/// The most parameters one statement may take: PostgreSQL's protocol counts them in 16 bits.
const MAX_PARAMETERS: usize = 65_535;

/// One multi-row statement in its [`CHUNKS`] sizes: `head`, then `rows` parenthesised groups
/// of `columns` numbered placeholders (`($1, $2), ($3, $4)`), then `tail`. Parameters bind in
/// the order the placeholders are numbered, so `head` and `tail` must not hold any.
///
/// sqlx declares each parameter's type when it prepares a statement (`INT8` for an `i64`,
/// `TEXT` for a string, also for `NULL`s), so the columns of a `VALUES` list take the types of
/// what is bound: PostgreSQL needs no casts in the statements.
pub(crate) struct MultiRow {
    texts: [String; CHUNKS.len()],
}

impl MultiRow {
    /// The texts of a statement whose rows have `columns` parameters each.
    ///
    /// Panics when `head` or `tail` holds a placeholder or the largest chunk would exceed the
    /// database's parameter limit (programming errors, caught by the tests that run every
    /// statement).
    pub(crate) fn new(head: &str, columns: usize, tail: &str) -> MultiRow {
        assert!(
            !head.contains('$') && !tail.contains('$'),
            "only the rows hold placeholders"
        );
        assert!(
            columns * CHUNKS[0] <= MAX_PARAMETERS,
            "{} rows of {columns} parameters exceed the limit of {MAX_PARAMETERS}",
            CHUNKS[0]
        );
        let texts = CHUNKS.map(|rows| {
            let mut sql = String::from(head);
            for r in 0..rows {
                sql.push_str(if r == 0 { "(" } else { ", (" });
                for c in 0..columns {
                    if c > 0 {
                        sql.push_str(", ");
                    }
                    sql.push_str(&format!("${}", r * columns + c + 1));
                }
                sql.push(')');
            }
            sql.push_str(tail);
            sql
        });
        MultiRow { texts }
    }

    /// The text for `rows` rows, one of [`CHUNKS`].
    pub(crate) fn text(&'static self, rows: usize) -> &'static str {
        let i = CHUNKS
            .iter()
            .position(|&n| n == rows)
            .expect("rows come in chunk sizes");
        &self.texts[i]
    }
}

/// `rows` split greedily into [`CHUNKS`] sizes, in order.
pub(crate) fn chunks<T>(rows: &[T]) -> impl Iterator<Item = &[T]> {
    let mut rest = rows;
    std::iter::from_fn(move || {
        let n = CHUNKS.into_iter().find(|&n| n <= rest.len())?;
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        Some(chunk)
    })
}

/// Runs `statement` over `rows` in chunks, `bind` binding one row's parameters in column
/// order; `error` turns a failure of a chunk into the contract's error. Returns the number of
/// rows the statements changed. No rows, no statement.
pub(crate) async fn execute<T>(
    conn: &mut PgConnection,
    statement: &'static MultiRow,
    rows: &[T],
    bind: impl Fn(Query<'static>, &T) -> Result<Query<'static>>,
    error: impl Fn(sqlx::Error, &[T]) -> StoreError,
) -> Result<u64> {
    let mut changed = 0;
    for chunk in chunks(rows) {
        let mut q = sqlx::query(statement.text(chunk.len()));
        for row in chunk {
            q = bind(q, row)?;
        }
        changed += q
            .execute(&mut *conn)
            .await
            .map_err(|e| error(e, chunk))?
            .rows_affected();
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_split_greedily_into_chunk_sizes() {
        let sizes = |n: usize| chunks(&vec![0u8; n]).map(<[u8]>::len).collect::<Vec<_>>();
        assert_eq!(sizes(0), Vec::<usize>::new());
        assert_eq!(sizes(1), [1]);
        assert_eq!(sizes(3), [1, 1, 1]);
        assert_eq!(sizes(20), [16, 4]);
        assert_eq!(sizes(500), [64, 64, 64, 64, 64, 64, 64, 16, 16, 16, 4]);
        let rows: Vec<usize> = (0..151).collect();
        let again: Vec<usize> = chunks(&rows).flatten().copied().collect();
        assert_eq!(again, rows, "every row once, in order");
    }

    #[test]
    fn texts_hold_a_placeholder_per_column_and_row() {
        let m = Box::leak(Box::new(MultiRow::new(
            "INSERT INTO t (a, b) VALUES ",
            2,
            " RETURNING a",
        )));
        assert_eq!(m.text(1), "INSERT INTO t (a, b) VALUES ($1, $2) RETURNING a");
        assert_eq!(
            m.text(4),
            "INSERT INTO t (a, b) VALUES ($1, $2), ($3, $4), ($5, $6), ($7, $8) RETURNING a"
        );
        assert_eq!(m.text(64).matches('$').count(), 128);
        assert!(m.text(64).ends_with("($127, $128) RETURNING a"));
    }

    #[test]
    #[should_panic(expected = "exceed the limit")]
    fn a_statement_over_the_parameter_limit_is_refused() {
        MultiRow::new("INSERT INTO t VALUES ", MAX_PARAMETERS / CHUNKS[0] + 1, "");
    }
}
