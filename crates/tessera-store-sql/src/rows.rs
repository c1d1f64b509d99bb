//! Multi-row statements: one statement writes many rows of a kind, so a lifecycle batch costs a
//! few statements per kind of row instead of one per row.
//!
//! The cost of a statement is mostly fixed (a round trip to the database or to the connection's
//! worker thread, finding the prepared statement, stepping it), so writing rows in groups is
//! what makes a batch cheap. A [`MultiRow`] is written as `head`, the rows as a `VALUES` list,
//! then `tail`; each driver makes its text from those parts (SQLite: `(?, ?), (?, ?)` in a few
//! fixed chunk sizes, see [`Driver::ROWS_PER_STATEMENT`]; PostgreSQL: one typed array per column
//! through `UNNEST`, all rows at once) and [`MultiRow::text`] keeps each text it made.

use std::any::TypeId;
use std::sync::{Arc, Mutex};

use tessera_store::{Result, StoreError};

use crate::{DbError, Driver, Value};

/// A statement over many rows: `head` (ending with `VALUES `), the rows, then `tail`.
/// Parameters bind in row order, each row's in column order; only the rows hold placeholders.
pub struct MultiRow {
    head: &'static str,
    columns: usize,
    tail: String,
    /// The texts drivers made of the statement, by driver and key (a few per driver).
    texts: Mutex<Vec<(TypeId, usize, Arc<str>)>>,
}

impl MultiRow {
    /// The statement whose rows have `columns` values each.
    ///
    /// Panics when `head` does not end with `VALUES ` or `head` or `tail` holds a placeholder
    /// (programming errors, caught by the tests that run every statement).
    pub fn new(head: &'static str, columns: usize, tail: &str) -> MultiRow {
        assert!(head.ends_with("VALUES "), "the rows follow VALUES");
        assert!(
            !head.contains(['?', '$']) && !tail.contains(['?', '$']),
            "only the rows hold placeholders"
        );
        MultiRow {
            head,
            columns,
            tail: tail.to_string(),
            texts: Mutex::new(Vec::new()),
        }
    }

    /// What comes before the rows, `VALUES ` included.
    pub fn head(&self) -> &'static str {
        self.head
    }

    /// The values of one row.
    pub fn columns(&self) -> usize {
        self.columns
    }

    /// What comes after the rows.
    pub fn tail(&self) -> &str {
        &self.tail
    }

    /// The text driver `D` makes of the statement for `key` (for example, a number of rows):
    /// `make`'s, made once and kept.
    pub fn text<D: ?Sized + 'static>(&self, key: usize, make: impl FnOnce(&MultiRow) -> String) -> Arc<str> {
        let driver = TypeId::of::<D>();
        let mut texts = self.texts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, _, text)) = texts.iter().find(|(d, k, _)| *d == driver && *k == key) {
            return text.clone();
        }
        let text: Arc<str> = make(self).into();
        texts.push((driver, key, text.clone()));
        text
    }
}

/// The values of the rows of a multi-row statement, collected with the same `.bind(…)` chain as
/// a query's parameters.
#[derive(Debug, Default)]
pub struct Values<'a>(Vec<Value<'a>>);

impl<'a> Values<'a> {
    /// The values with `v` as the next.
    pub fn bind(mut self, v: impl Into<Value<'a>>) -> Values<'a> {
        self.0.push(v.into());
        self
    }
}

/// A group of rows of one kind, written with the other groups of a batch in one statement by
/// a driver that can ([`Driver::ONE_STATEMENT`]).
pub struct Group<'a> {
    pub statement: &'static MultiRow,
    pub rows: usize,
    /// Each row's values in turn, in column order.
    pub values: Vec<Value<'a>>,
    /// Whether the statement's answer counts the rows this group changed (updates, whose
    /// count says whether every row was found).
    pub counted: bool,
}

/// The group of `rows` for `statement`, `bind` giving one row's values in column order; `None`
/// for no rows.
pub fn group<'a, T>(
    statement: &'static MultiRow,
    rows: &'a [T],
    bind: impl Fn(Values<'a>, &'a T) -> Result<Values<'a>>,
    counted: bool,
) -> Result<Option<Group<'a>>> {
    if rows.is_empty() {
        return Ok(None);
    }
    Ok(Some(Group {
        statement,
        rows: rows.len(),
        values: bind_all(statement, rows, &bind)?,
        counted,
    }))
}

/// Each of `rows`' values in turn, in column order, as `bind` gives them; a row that binds
/// other than the statement's column count is a bug in the caller.
fn bind_all<'a, T>(
    statement: &'static MultiRow,
    rows: &'a [T],
    bind: &impl Fn(Values<'a>, &'a T) -> Result<Values<'a>>,
) -> Result<Vec<Value<'a>>> {
    let mut values = Values(Vec::with_capacity(rows.len() * statement.columns));
    for row in rows {
        values = bind(values, row)?;
    }
    assert_eq!(
        values.0.len(),
        rows.len() * statement.columns,
        "every row binds {} values",
        statement.columns
    );
    Ok(values.0)
}

/// `rows` split greedily into groups of `sizes` (largest first), in order, the rest (fewer rows
/// than the smallest size) in one last group; all in one group when `sizes` is empty. No rows,
/// no group.
pub fn chunks<'r, T>(rows: &'r [T], sizes: &'static [usize]) -> impl Iterator<Item = &'r [T]> {
    let mut rest = rows;
    std::iter::from_fn(move || {
        let n = sizes.iter().copied().find(|&n| n <= rest.len()).unwrap_or(rest.len());
        if n == 0 {
            return None;
        }
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        Some(chunk)
    })
}

/// Runs `statement` over `rows` in the driver's groups ([`Driver::ROWS_PER_STATEMENT`]), `bind`
/// giving one row's values in column order; `error` turns the failure of a group into the
/// contract's error. Returns the number of rows the statements changed. No rows, no statement.
pub async fn execute<'a, D: Driver, T>(
    conn: &mut D::Connection,
    statement: &'static MultiRow,
    rows: &'a [T],
    bind: impl Fn(Values<'a>, &'a T) -> Result<Values<'a>>,
    error: impl Fn(DbError, &[T]) -> StoreError,
) -> Result<u64> {
    let mut changed = 0;
    for chunk in chunks(rows, D::ROWS_PER_STATEMENT) {
        let values = bind_all(statement, chunk, &bind)?;
        changed += D::execute_rows(conn, statement, chunk.len(), values)
            .await
            .map_err(|e| error(e, chunk))?;
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_split_greedily_into_chunk_sizes() {
        const SIZES: &[usize] = &[64, 16, 4, 1];
        let sizes = |n: usize| chunks(&vec![0u8; n], SIZES).map(<[u8]>::len).collect::<Vec<_>>();
        assert_eq!(sizes(0), Vec::<usize>::new());
        assert_eq!(sizes(1), [1]);
        assert_eq!(sizes(3), [1, 1, 1]);
        assert_eq!(sizes(20), [16, 4]);
        assert_eq!(sizes(500), [64, 64, 64, 64, 64, 64, 64, 16, 16, 16, 4]);
        let rows: Vec<usize> = (0..151).collect();
        let again: Vec<usize> = chunks(&rows, SIZES).flatten().copied().collect();
        assert_eq!(again, rows, "every row once, in order");
    }

    #[test]
    fn the_rest_below_the_smallest_size_is_one_group() {
        const SIZES: &[usize] = &[64];
        let sizes = |n: usize| chunks(&vec![0u8; n], SIZES).map(<[u8]>::len).collect::<Vec<_>>();
        assert_eq!(sizes(0), Vec::<usize>::new());
        assert_eq!(sizes(5), [5]);
        assert_eq!(sizes(64), [64]);
        assert_eq!(sizes(150), [64, 64, 22]);
    }

    #[test]
    fn without_sizes_all_rows_go_in_one_group() {
        let rows: Vec<usize> = (0..500).collect();
        let groups: Vec<&[usize]> = chunks(&rows, &[]).collect();
        assert_eq!(groups, [&rows[..]]);
        assert_eq!(chunks(&[] as &[usize], &[]).count(), 0);
    }

    #[test]
    fn each_driver_makes_its_texts_once_per_key() {
        struct First;
        struct Second;
        let m = MultiRow::new("INSERT INTO t (a) VALUES ", 1, "");
        let made = std::cell::Cell::new(0);
        let make = |tag: &str| {
            made.set(made.get() + 1);
            tag.to_string()
        };
        assert_eq!(&*m.text::<First>(1, |_| make("first 1")), "first 1");
        assert_eq!(&*m.text::<First>(1, |_| make("again")), "first 1");
        assert_eq!(&*m.text::<First>(4, |_| make("first 4")), "first 4");
        assert_eq!(&*m.text::<Second>(1, |_| make("second 1")), "second 1");
        assert_eq!(made.get(), 3, "one text per driver and key");
    }

    #[test]
    #[should_panic(expected = "the rows follow VALUES")]
    fn the_rows_follow_values() {
        MultiRow::new("INSERT INTO t (a) ", 1, "");
    }

    #[test]
    #[should_panic(expected = "only the rows hold placeholders")]
    fn only_the_rows_hold_placeholders() {
        MultiRow::new("INSERT INTO t (a) VALUES ", 1, " WHERE a = $1");
    }
}
