//! Many rows in one statement: one statement writes all the rows of a kind, however many, so
//! a lifecycle batch costs one round trip per kind of row.
//!
//! The SQLite store writes rows in multi-row `VALUES` lists of fixed chunk sizes. Here each
//! column travels as one array parameter and `UNNEST` turns the arrays back into rows:
//! `INSERT INTO t (a, b) SELECT * FROM UNNEST($1::BIGINT[], $2::TEXT[])`. A statement then has
//! one text whatever the number of rows (prepared once per connection), and a batch of 200
//! workloads costs the same seven round trips as a batch of one — round trips, not rows, are
//! what a commit to a database in another process pays for.
//!
//! A row is collected with the same `.bind(…)` chain as a query's parameters ([`Row`]); the
//! column types come from the values (`i64` → `BIGINT`, strings → `TEXT`, `bool` → `BOOLEAN`,
//! `f64` → `DOUBLE PRECISION`, each possibly `NULL`).

use std::sync::OnceLock;

use sqlx::postgres::PgConnection;
use tessera_store::{Result, StoreError};

/// One value of a row.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Cell {
    I64(Option<i64>),
    Text(Option<String>),
    Bool(bool),
    F64(Option<f64>),
}

impl Cell {
    fn sql_array_type(&self) -> &'static str {
        match self {
            Cell::I64(_) => "BIGINT[]",
            Cell::Text(_) => "TEXT[]",
            Cell::Bool(_) => "BOOLEAN[]",
            Cell::F64(_) => "DOUBLE PRECISION[]",
        }
    }
}

impl From<i64> for Cell {
    fn from(v: i64) -> Self {
        Cell::I64(Some(v))
    }
}
impl From<Option<i64>> for Cell {
    fn from(v: Option<i64>) -> Self {
        Cell::I64(v)
    }
}
impl From<bool> for Cell {
    fn from(v: bool) -> Self {
        Cell::Bool(v)
    }
}
impl From<Option<f64>> for Cell {
    fn from(v: Option<f64>) -> Self {
        Cell::F64(v)
    }
}
impl From<&str> for Cell {
    fn from(v: &str) -> Self {
        Cell::Text(Some(v.to_string()))
    }
}
impl From<String> for Cell {
    fn from(v: String) -> Self {
        Cell::Text(Some(v))
    }
}
impl From<&String> for Cell {
    fn from(v: &String) -> Self {
        Cell::Text(Some(v.clone()))
    }
}
impl From<Option<&str>> for Cell {
    fn from(v: Option<&str>) -> Self {
        Cell::Text(v.map(str::to_string))
    }
}
impl From<Option<String>> for Cell {
    fn from(v: Option<String>) -> Self {
        Cell::Text(v)
    }
}
impl From<&Option<String>> for Cell {
    fn from(v: &Option<String>) -> Self {
        Cell::Text(v.clone())
    }
}

/// The values of one row, in column order.
#[derive(Debug, Default)]
pub(crate) struct Row(Vec<Cell>);

impl Row {
    /// The row with `v` as its next column.
    pub(crate) fn bind(mut self, v: impl Into<Cell>) -> Row {
        self.0.push(v.into());
        self
    }
}

/// What binding functions build (named like a query, as they read like one).
pub(crate) type Query<'q> = Row;

/// A statement over many rows: `head` (which must end with `VALUES `, as in the SQLite store),
/// the rows as `SELECT * FROM UNNEST(…)` of one typed array per column, then `tail`.
pub(crate) struct MultiRow {
    head: &'static str,
    columns: usize,
    tail: String,
    /// The text, made from the first row's column types.
    text: OnceLock<String>,
}

impl MultiRow {
    /// The statement whose rows have `columns` values each.
    ///
    /// Panics when `head` does not end with `VALUES ` or holds a placeholder (programming
    /// errors, caught by the tests that run every statement).
    pub(crate) fn new(head: &'static str, columns: usize, tail: &str) -> MultiRow {
        assert!(head.ends_with("VALUES "), "the rows follow VALUES");
        assert!(
            !head.contains('$') && !tail.contains('$'),
            "only the rows hold placeholders"
        );
        MultiRow {
            head,
            columns,
            tail: tail.to_string(),
            text: OnceLock::new(),
        }
    }

    /// The text for rows of `first`'s column types.
    fn text(&self, first: &Row) -> &str {
        self.text.get_or_init(|| {
            let arrays: Vec<String> = first
                .0
                .iter()
                .enumerate()
                .map(|(i, c)| format!("${}::{}", i + 1, c.sql_array_type()))
                .collect();
            format!(
                "{}SELECT * FROM UNNEST({}){}",
                self.head.strip_suffix("VALUES ").expect("checked in new"),
                arrays.join(", "),
                self.tail
            )
        })
    }
}

/// Runs `statement` over `rows` in one round trip, `bind` giving one row's values in column
/// order; `error` turns a failure into the contract's error. Returns the number of rows the
/// statement changed. No rows, no statement.
pub(crate) async fn execute<T>(
    conn: &mut PgConnection,
    statement: &'static MultiRow,
    rows: &[T],
    bind: impl Fn(Row, &T) -> Result<Row>,
    error: impl Fn(sqlx::Error, &[T]) -> StoreError,
) -> Result<u64> {
    if rows.is_empty() {
        return Ok(0);
    }
    let cells: Vec<Row> = rows.iter().map(|r| bind(Row::default(), r)).collect::<Result<_>>()?;
    assert!(
        cells.iter().all(|r| r.0.len() == statement.columns),
        "every row binds {} values",
        statement.columns
    );
    let text = statement.text(&cells[0]).to_string();
    let mut q = sqlx::query(sqlx::AssertSqlSafe(text));
    for c in 0..statement.columns {
        q = match &cells[0].0[c] {
            Cell::I64(_) => q.bind(column(&cells, c, |v| match v {
                Cell::I64(x) => *x,
                other => mixed(c, other),
            })),
            Cell::Text(_) => q.bind(column(&cells, c, |v| match v {
                Cell::Text(x) => x.clone(),
                other => mixed(c, other),
            })),
            Cell::Bool(_) => q.bind(column(&cells, c, |v| match v {
                Cell::Bool(x) => *x,
                other => mixed(c, other),
            })),
            Cell::F64(_) => q.bind(column(&cells, c, |v| match v {
                Cell::F64(x) => *x,
                other => mixed(c, other),
            })),
        };
    }
    Ok(q.execute(&mut *conn).await.map_err(|e| error(e, rows))?.rows_affected())
}

/// Column `c` of every row.
fn column<V>(rows: &[Row], c: usize, value: impl Fn(&Cell) -> V) -> Vec<V> {
    rows.iter().map(|r| value(&r.0[c])).collect()
}

fn mixed<V>(c: usize, other: &Cell) -> V {
    panic!("column {c} holds values of different types ({other:?})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statement_is_one_text_with_one_typed_array_per_column() {
        let m = Box::leak(Box::new(MultiRow::new(
            "INSERT INTO t (a, b, c, d) VALUES ",
            4,
            " RETURNING a",
        )));
        let row = Row::default().bind(1i64).bind(Some("x")).bind(true).bind(None::<f64>);
        assert_eq!(
            m.text(&row),
            "INSERT INTO t (a, b, c, d) SELECT * FROM UNNEST($1::BIGINT[], $2::TEXT[], $3::BOOLEAN[], \
             $4::DOUBLE PRECISION[]) RETURNING a"
        );
        let cte = Box::leak(Box::new(MultiRow::new(
            "WITH v (id, x) AS (VALUES ",
            2,
            ") UPDATE t SET x = v.x FROM v WHERE t.id = v.id",
        )));
        let row = Row::default().bind(None::<i64>).bind(String::from("y"));
        assert_eq!(
            cte.text(&row),
            "WITH v (id, x) AS (SELECT * FROM UNNEST($1::BIGINT[], $2::TEXT[])) UPDATE t SET x = v.x FROM v \
             WHERE t.id = v.id"
        );
    }

    #[test]
    #[should_panic(expected = "the rows follow VALUES")]
    fn the_rows_follow_values() {
        MultiRow::new("INSERT INTO t (a) ", 1, "");
    }
}
