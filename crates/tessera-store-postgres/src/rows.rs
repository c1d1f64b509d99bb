//! PostgreSQL's form of the multi-row statements (`tessera_store_sql::rows`): one statement
//! writes all the rows of a kind, however many; a lifecycle batch writes all its kinds in one
//! statement.
//!
//! The SQLite store writes rows in multi-row `VALUES` lists of fixed chunk sizes. Here each
//! column travels as one array parameter and `UNNEST` turns the arrays back into rows:
//! `INSERT INTO t (a, b) SELECT * FROM UNNEST($1::BIGINT[], $2::TEXT[])`. A statement then has
//! one text whatever the number of rows (prepared once per connection), and a batch of 200
//! workloads costs the same round trips as a batch of one — round trips, not rows, are
//! what a commit to a database in another process pays for.
//!
//! A lifecycle batch goes further: all its groups, with the check of its fence and the
//! numbering of its audit records, are parts of one statement ([`one_statement_text`]), so it
//! costs three round trips (`BEGIN`, the statement, `COMMIT`) where it cost one per kind of row
//! and the fence's check.
//!
//! The column types come from the values ([`Value`]: integers → `BIGINT`, texts → `TEXT`,
//! booleans → `BOOLEAN`, floats → `DOUBLE PRECISION`, each possibly `NULL`).

use sqlx::postgres::PgArguments;
use sqlx::{AssertSqlSafe, Postgres};
use tessera_store_sql::{Group, MultiRow, Value, audit};

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
    text_at(statement, first, 0)
}

/// `text` with the arrays numbered after the first `offset` parameters.
fn text_at(statement: &MultiRow, first: &[Value<'_>], offset: usize) -> String {
    format!(
        "{}SELECT * FROM UNNEST({}){}",
        statement
            .head()
            .strip_suffix("VALUES ")
            .expect("the rows follow VALUES"),
        arrays(first, offset),
        statement.tail()
    )
}

/// `$n::TYPE[]` for each column of rows whose first is `first`, numbered from `offset + 1`.
fn arrays(first: &[Value<'_>], offset: usize) -> String {
    let arrays: Vec<String> = first
        .iter()
        .enumerate()
        .map(|(i, v)| format!("${}::{}", offset + i + 1, sql_array_type(v)))
        .collect();
    arrays.join(", ")
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
    bind_columns(sqlx::query(AssertSqlSafe(text)), columns, values)
}

/// The text of a lifecycle batch in one statement (`Driver::execute_one_statement`): each part
/// a data-modifying common table expression, which PostgreSQL runs once each whether or not
/// the query reads it, all on the snapshot taken before the statement:
///
/// ```sql
/// WITH f AS (SELECT 1 FROM leader WHERE … FOR SHARE),          -- the fence, $1 and $2
///      g0 AS (INSERT INTO workloads (…) SELECT * FROM UNNEST(…)),
///      g1 AS (WITH v (…) AS (SELECT * FROM UNNEST(…)) UPDATE workloads … RETURNING 1),
///      …
///      audit_seq AS (UPDATE sequences SET value = value + $k WHERE name = 'audit' RETURNING value),
///      audit_rows AS (INSERT INTO audit_log (seq, …) SELECT audit_seq.value - $k + u.ord, u.… FROM
///                     audit_seq, UNNEST(…) WITH ORDINALITY AS u (…, ord))
/// SELECT (SELECT count(*) FROM f) AS held, (SELECT count(*) FROM g1) AS n0, …
/// ```
///
/// A counted group returns a row per row it changed (`RETURNING 1`), counted as `n0, n1 …` in
/// order. The audit records are numbered as `tessera_store_sql::audit::append` numbers them:
/// the update of the sequence row takes its lock, held until the transaction ends.
pub(crate) fn one_statement_text(fence: Option<&str>, groups: &[Group<'_>], audit: Option<&Group<'_>>) -> String {
    let mut ctes = Vec::new();
    let mut offset = 0;
    if let Some(check) = fence {
        ctes.push(format!("f AS ({check})"));
        offset = 2;
    }
    let mut counts = Vec::new();
    for (i, g) in groups.iter().enumerate() {
        let columns = g.statement.columns();
        let body = text_at(g.statement, &g.values[..columns], offset);
        offset += columns;
        if g.counted {
            ctes.push(format!("g{i} AS ({body} RETURNING 1)"));
            counts.push(format!("(SELECT count(*) FROM g{i}) AS n{}", counts.len()));
        } else {
            ctes.push(format!("g{i} AS ({body})"));
        }
    }
    if let Some(a) = audit {
        let columns = a.statement.columns();
        let n = offset + 1;
        let names = audit::AFTER_SEQ;
        let read: Vec<String> = names.split(", ").map(|c| format!("u.{c}")).collect();
        ctes.push(format!(
            "audit_seq AS (UPDATE sequences SET value = value + ${n}::BIGINT WHERE name = 'audit' RETURNING value)"
        ));
        ctes.push(format!(
            "audit_rows AS (INSERT INTO audit_log (seq, {names}) SELECT audit_seq.value - ${n}::BIGINT + u.ord, {} \
             FROM audit_seq, UNNEST({}) WITH ORDINALITY AS u ({names}, ord))",
            read.join(", "),
            arrays(&a.values[..columns], n)
        ));
    }
    let held = if fence.is_some() {
        "(SELECT count(*) FROM f)"
    } else {
        "1::BIGINT"
    };
    let mut select = vec![format!("{held} AS held")];
    select.extend(counts);
    if ctes.is_empty() {
        format!("SELECT {}", select.join(", "))
    } else {
        format!("WITH {} SELECT {}", ctes.join(", "), select.join(", "))
    }
}

/// `q` with the `values` of rows of `columns` values each bound as one array per column.
pub(crate) fn bind_columns<'q>(
    mut q: sqlx::query::Query<'q, Postgres, PgArguments>,
    columns: usize,
    values: &[Value<'_>],
) -> sqlx::query::Query<'q, Postgres, PgArguments> {
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

    /// A batch in one statement: the fence first ($1, $2), each group's arrays numbered after
    /// the previous ones, counted groups returning a row per changed row and counted in order,
    /// and the audit records numbered from the sequence row after the groups.
    #[test]
    fn a_batch_is_one_statement_with_its_parts_numbered_in_order() {
        let insert = Box::leak(Box::new(MultiRow::new("INSERT INTO t (a, b) VALUES ", 2, "")));
        let update = Box::leak(Box::new(MultiRow::new(
            "WITH v (id, x) AS (VALUES ",
            2,
            ") UPDATE t SET b = v.x FROM v WHERE t.a = v.id",
        )));
        let audit_rows = Box::leak(Box::new(MultiRow::new(
            "INSERT INTO audit_log (at, request_id, actor, tenant, action, target, outcome, detail) VALUES ",
            8,
            "",
        )));
        let groups = vec![
            Group {
                statement: insert,
                rows: 1,
                values: vec![Value::from(1i64), Value::from("x")],
                counted: false,
            },
            Group {
                statement: update,
                rows: 1,
                values: vec![Value::from(2i64), Value::from("y")],
                counted: true,
            },
        ];
        let audit = Group {
            statement: audit_rows,
            rows: 1,
            values: vec![
                Value::from(7i64),
                Value::from("req"),
                Value::from("ann"),
                Value::from(None::<&str>),
                Value::from("POST /x"),
                Value::from("/x"),
                Value::from(201i64),
                Value::from(""),
            ],
            counted: false,
        };
        let fence = "SELECT 1 FROM leader WHERE holder = $1 AND epoch = $2 FOR SHARE";
        assert_eq!(
            one_statement_text(Some(fence), &groups, Some(&audit)),
            "WITH f AS (SELECT 1 FROM leader WHERE holder = $1 AND epoch = $2 FOR SHARE), \
             g0 AS (INSERT INTO t (a, b) SELECT * FROM UNNEST($3::BIGINT[], $4::TEXT[])), \
             g1 AS (WITH v (id, x) AS (SELECT * FROM UNNEST($5::BIGINT[], $6::TEXT[])) UPDATE t SET b = v.x FROM v \
             WHERE t.a = v.id RETURNING 1), \
             audit_seq AS (UPDATE sequences SET value = value + $7::BIGINT WHERE name = 'audit' RETURNING value), \
             audit_rows AS (INSERT INTO audit_log (seq, at, request_id, actor, tenant, action, target, outcome, detail) \
             SELECT audit_seq.value - $7::BIGINT + u.ord, u.at, u.request_id, u.actor, u.tenant, u.action, u.target, \
             u.outcome, u.detail FROM audit_seq, UNNEST($8::BIGINT[], $9::TEXT[], $10::TEXT[], $11::TEXT[], \
             $12::TEXT[], $13::TEXT[], $14::BIGINT[], $15::TEXT[]) WITH ORDINALITY AS u (at, request_id, actor, \
             tenant, action, target, outcome, detail, ord)) \
             SELECT (SELECT count(*) FROM f) AS held, (SELECT count(*) FROM g1) AS n0"
        );
        assert_eq!(
            one_statement_text(None, &groups[..1], None),
            "WITH g0 AS (INSERT INTO t (a, b) SELECT * FROM UNNEST($1::BIGINT[], $2::TEXT[])) SELECT 1::BIGINT AS held"
        );
    }

    #[test]
    #[should_panic(expected = "holds values of different types")]
    fn a_column_holds_values_of_one_type() {
        let m = Box::leak(Box::new(MultiRow::new("INSERT INTO t (a) VALUES ", 1, "")));
        let _ = query(m, 2, &[Value::from(1i64), Value::from("x")]);
    }
}
