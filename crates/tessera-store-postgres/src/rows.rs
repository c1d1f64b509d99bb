//! PostgreSQL's form of the multi-row statements (`tessera_store_sql::rows`): one statement
//! writes all the rows of a kind, however many, so a lifecycle batch costs one round trip per
//! kind of row.
//!
//! The SQLite store writes rows in multi-row `VALUES` lists of fixed chunk sizes. Here each
//! column travels as one array parameter and `UNNEST` turns the arrays back into rows:
//! `INSERT INTO t (a, b) SELECT * FROM UNNEST($1::BIGINT[], $2::TEXT[])`. A statement then has
//! one text whatever the number of rows (prepared once per connection), and a batch of 200
//! workloads costs the same seven round trips as a batch of one — round trips, not rows, are
//! what a commit to a database in another process pays for.
//!
//! The column types come from the values ([`Value`]: integers → `BIGINT`, texts → `TEXT`,
//! booleans → `BOOLEAN`, floats → `DOUBLE PRECISION`, each possibly `NULL`).

use sqlx::postgres::PgArguments;
use sqlx::{AssertSqlSafe, Postgres};
use tessera_store_sql::{MultiRow, Value};

use crate::PgStore;

/// The array type of a column of `v`s.
fn sql_array_type(v: &Value<'_>) -> &'static str {
    match v {
        Value::Int(_) => "BIGINT[]",
        Value::Text(_) => "TEXT[]",
        Value::Flag(_) => "BOOLEAN[]",
        Value::Float(_) => "DOUBLE PRECISION[]",
    }
}

/// The text of `statement` for rows whose first is `first`: its head without `VALUES `, the
/// rows as `SELECT * FROM UNNEST(…)` of one typed array per column, then its tail.
fn text(statement: &MultiRow, first: &[Value<'_>]) -> String {
    let arrays: Vec<String> = first
        .iter()
        .enumerate()
        .map(|(i, v)| format!("${}::{}", i + 1, sql_array_type(v)))
        .collect();
    format!(
        "{}SELECT * FROM UNNEST({}){}",
        statement
            .head()
            .strip_suffix("VALUES ")
            .expect("the rows follow VALUES"),
        arrays.join(", "),
        statement.tail()
    )
}

/// `statement` over `rows` rows whose values are `values` (row after row), each column bound as
/// one array; the text is made once, from the first row's types.
pub(crate) fn query<'q>(
    statement: &'static MultiRow,
    rows: usize,
    values: &[Value<'_>],
) -> sqlx::query::Query<'q, Postgres, PgArguments> {
    let columns = statement.columns();
    assert_eq!(values.len(), rows * columns, "every row binds {columns} values");
    let text = statement.text::<PgStore>(0, |m| text(m, &values[..columns]));
    let mut q = sqlx::query(AssertSqlSafe(text));
    for c in 0..columns {
        let column = values.iter().skip(c).step_by(columns);
        q = match &values[c] {
            Value::Int(_) => q.bind(
                column
                    .map(|v| match v {
                        Value::Int(x) => *x,
                        other => mixed(c, other),
                    })
                    .collect::<Vec<_>>(),
            ),
            Value::Text(_) => q.bind(
                column
                    .map(|v| match v {
                        Value::Text(x) => x.as_deref(),
                        other => mixed(c, other),
                    })
                    .collect::<Vec<_>>(),
            ),
            Value::Flag(_) => q.bind(
                column
                    .map(|v| match v {
                        Value::Flag(x) => *x,
                        other => mixed(c, other),
                    })
                    .collect::<Vec<_>>(),
            ),
            Value::Float(_) => q.bind(
                column
                    .map(|v| match v {
                        Value::Float(x) => *x,
                        other => mixed(c, other),
                    })
                    .collect::<Vec<_>>(),
            ),
        };
    }
    q
}

fn mixed<V>(c: usize, other: &Value<'_>) -> V {
    panic!("column {c} holds values of different types ({other:?})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statement_is_one_text_with_one_typed_array_per_column() {
        let m = MultiRow::new("INSERT INTO t (a, b, c, d) VALUES ", 4, " RETURNING a");
        let row = [
            Value::from(1i64),
            Value::from(Some("x")),
            Value::from(true),
            Value::from(None::<f64>),
        ];
        assert_eq!(
            text(&m, &row),
            "INSERT INTO t (a, b, c, d) SELECT * FROM UNNEST($1::BIGINT[], $2::TEXT[], $3::BOOLEAN[], \
             $4::DOUBLE PRECISION[]) RETURNING a"
        );
        let cte = MultiRow::new(
            "WITH v (id, x) AS (VALUES ",
            2,
            ") UPDATE t SET x = v.x FROM v WHERE t.id = v.id",
        );
        let row = [Value::from(None::<i64>), Value::from(String::from("y"))];
        assert_eq!(
            text(&cte, &row),
            "WITH v (id, x) AS (SELECT * FROM UNNEST($1::BIGINT[], $2::TEXT[])) UPDATE t SET x = v.x FROM v \
             WHERE t.id = v.id"
        );
    }

    #[test]
    #[should_panic(expected = "holds values of different types")]
    fn a_column_holds_values_of_one_type() {
        let m = Box::leak(Box::new(MultiRow::new("INSERT INTO t (a) VALUES ", 1, "")));
        let _ = query(m, 2, &[Value::from(1i64), Value::from("x")]);
    }
}
