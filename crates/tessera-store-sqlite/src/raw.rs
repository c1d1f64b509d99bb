//! Statements run directly on a connection's SQLite handle: the read of many rows, and the
//! write of a lifecycle batch.
//!
//! sqlx copies every value of every row into its own allocation and hands each row from its
//! worker thread to the async side; reading 100,000 workloads of 55 columns that way is most of
//! a restart. [`Statement`] steps a prepared statement on the connection's own handle (sqlx's
//! [`LockedSqliteHandle`](sqlx::sqlite::LockedSqliteHandle), which parks the worker meanwhile)
//! and lends each cell to the caller, who decodes it before the next step.
//!
//! Through sqlx, each statement of a write transaction is a round trip between the caller's
//! thread and the connection's worker thread: a lifecycle batch of a few hundred rows took
//! about twelve (`BEGIN`, a statement per group of rows, the audit numbers, `COMMIT`), and on
//! a busy machine each waits for a thread to be scheduled. [`write_batch`] runs the whole
//! transaction on the caller's thread, with the statements prepared for it, in one lock of
//! the handle.
//!
//! This is the crate's only `unsafe` code; each block states why it holds.

use std::ffi::{CStr, c_int};
use std::marker::PhantomData;
use std::ptr::{NonNull, null_mut};
use std::sync::{Arc, LazyLock};

use libsqlite3_sys as ffi;
use sqlx::sqlite::LockedSqliteHandle;
use tessera_store::{Result, StoreError};
use tessera_store_sql::rows::Group;
use tessera_store_sql::{DbError, DbResult, MultiRow, Value};

/// A prepared statement on a locked connection handle, which it borrows; finalised when
/// dropped.
pub(crate) struct Statement<'h> {
    db: NonNull<ffi::sqlite3>,
    stmt: NonNull<ffi::sqlite3_stmt>,
    /// The column names, for errors.
    names: &'static [&'static str],
    /// `step` last returned a row: only then may its cells be read.
    on_row: bool,
    _handle: PhantomData<&'h mut ()>,
}

impl<'h> Statement<'h> {
    /// Prepares `sql` on the locked handle; `names` are the statement's columns, in order.
    pub(crate) fn prepare(
        handle: &'h mut LockedSqliteHandle<'_>,
        sql: &str,
        names: &'static [&'static str],
    ) -> Result<Statement<'h>> {
        let db = handle.as_raw_handle();
        let mut stmt = null_mut();
        let len = c_int::try_from(sql.len()).expect("a statement shorter than 2 GiB");
        // SAFETY: `db` is an open handle that no other thread uses while the caller holds its
        // lock; `sql` is valid for `len` bytes and SQLite copies what it keeps of it.
        let rc = unsafe { ffi::sqlite3_prepare_v2(db.as_ptr(), sql.as_ptr().cast(), len, &mut stmt, null_mut()) };
        if rc != ffi::SQLITE_OK {
            return Err(error(db, rc));
        }
        let stmt = NonNull::new(stmt).expect("a statement that is not empty");
        let statement = Statement {
            db,
            stmt,
            names,
            on_row: false,
            _handle: PhantomData,
        };
        // SAFETY: `stmt` was just prepared on `db`.
        let count = unsafe { ffi::sqlite3_column_count(stmt.as_ptr()) };
        if usize::try_from(count).ok() != Some(names.len()) {
            panic!("the statement has {count} columns, {} were named", names.len());
        }
        Ok(statement)
    }

    /// Moves to the next row: `false` once every row has been read.
    pub(crate) fn step(&mut self) -> Result<bool> {
        // SAFETY: the statement is prepared and finalised only on drop.
        let rc = unsafe { ffi::sqlite3_step(self.stmt.as_ptr()) };
        self.on_row = rc == ffi::SQLITE_ROW;
        match rc {
            ffi::SQLITE_ROW => Ok(true),
            ffi::SQLITE_DONE => Ok(false),
            rc => Err(error(self.db, rc)),
        }
    }

    fn kind(&self, i: usize) -> c_int {
        assert!(self.on_row, "a cell read while the statement is on no row");
        assert!(i < self.names.len(), "column {i} of {}", self.names.len());
        // SAFETY: the statement is on a row and `i` is below the column count (both checked
        // above; the count was checked against `names` at `prepare`).
        unsafe { ffi::sqlite3_column_type(self.stmt.as_ptr(), i as c_int) }
    }

    fn mismatch(&self, i: usize, want: &str, kind: c_int) -> StoreError {
        let got = match kind {
            ffi::SQLITE_INTEGER => "an integer",
            ffi::SQLITE_FLOAT => "a real",
            ffi::SQLITE_TEXT => "text",
            ffi::SQLITE_BLOB => "a blob",
            _ => "NULL",
        };
        StoreError::Corrupt(format!("column `{}`: {want} expected, {got} found", self.names[i]))
    }

    /// The integer in column `i` of the current row, or `None` when it is NULL.
    pub(crate) fn int(&self, i: usize) -> Result<Option<i64>> {
        match self.kind(i) {
            ffi::SQLITE_NULL => Ok(None),
            // SAFETY: as in `kind`; the value is an integer, so nothing is converted.
            ffi::SQLITE_INTEGER => Ok(Some(unsafe {
                ffi::sqlite3_column_int64(self.stmt.as_ptr(), i as c_int)
            })),
            other => Err(self.mismatch(i, "an integer", other)),
        }
    }

    /// The text in column `i` of the current row, or `None` when it is NULL. It is valid until
    /// the next step.
    pub(crate) fn text(&self, i: usize) -> Result<Option<&str>> {
        match self.kind(i) {
            ffi::SQLITE_NULL => Ok(None),
            ffi::SQLITE_TEXT => {
                // SAFETY: as in `kind`. The value is text, so `sqlite3_column_text` converts
                // nothing and returns a pointer to `sqlite3_column_bytes` bytes that stays valid
                // until the statement steps or is finalised, both of which need `&mut self`
                // while the returned borrow of `self` lives.
                let bytes = unsafe {
                    let p = ffi::sqlite3_column_text(self.stmt.as_ptr(), i as c_int);
                    let n = ffi::sqlite3_column_bytes(self.stmt.as_ptr(), i as c_int);
                    if p.is_null() {
                        &[][..]
                    } else {
                        std::slice::from_raw_parts(p, n as usize)
                    }
                };
                std::str::from_utf8(bytes)
                    .map(Some)
                    .map_err(|e| StoreError::Corrupt(format!("column `{}`: {e}", self.names[i])))
            }
            other => Err(self.mismatch(i, "text", other)),
        }
    }
}

impl Drop for Statement<'_> {
    fn drop(&mut self) {
        // SAFETY: the statement was prepared on this handle and is finalised once, here.
        unsafe {
            ffi::sqlite3_finalize(self.stmt.as_ptr());
        }
    }
}

/// SQLite's message for `rc` on `db`, classified as sqlx errors are (`crate::db_error`): a
/// corrupt file or one that is not a database is `Corrupt`, anything else `Unavailable`.
fn error(db: NonNull<ffi::sqlite3>, rc: c_int) -> StoreError {
    // SAFETY: `db` is open and locked by the caller; `sqlite3_errmsg` returns a NUL-terminated
    // string owned by SQLite, copied here before any other call on the handle.
    let message = unsafe { CStr::from_ptr(ffi::sqlite3_errmsg(db.as_ptr())) };
    let message = format!("(code: {rc}) {}", message.to_string_lossy());
    match rc & 0xff {
        ffi::SQLITE_CORRUPT | ffi::SQLITE_NOTADB => StoreError::Corrupt(message),
        _ => StoreError::Unavailable(message),
    }
}

/// The connection lifecycle batches are written on: a SQLite handle of the store's own (not
/// one of sqlx's), opened on the database file with the pool's settings, and the statements
/// prepared on it, kept from one batch to the next. Owning the handle is what lets them be
/// kept: sqlx closes its connections when it likes (a pool retires them after a while) and
/// refuses to close one on which statements are still prepared; this one finalises its
/// statements and then closes, when the store is dropped.
pub(crate) struct BatchConnection {
    db: NonNull<ffi::sqlite3>,
    /// The statements prepared on `db`, by text. The texts of `crate::rows` are each made
    /// once, so a text is found by its allocation; at most four per kind of row.
    prepared: Vec<(Arc<str>, Write)>,
}

// SAFETY: SQLite is built thread-safe (libsqlite3-sys's bundled default), so a handle and its
// statements may move between threads as long as one thread at a time uses them, which
// `&mut self` on every method (and the store's mutex around it) ensures.
unsafe impl Send for BatchConnection {}

impl std::fmt::Debug for BatchConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchConnection")
            .field("prepared", &self.prepared.len())
            .finish()
    }
}

impl BatchConnection {
    /// Opens the database file `path`, which exists and is migrated, for writing: WAL (the
    /// file's mode already), `synchronous=FULL`, foreign keys on, a busy timeout of
    /// `busy_timeout_ms`, no automatic checkpoint and a page cache of `cache_size` (SQLite's
    /// `cache_size` pragma: negative, KiB). Extended result codes are on, so that a failed
    /// write says which constraint it broke.
    pub(crate) fn open(path: &std::path::Path, busy_timeout_ms: c_int, cache_size: &str) -> Result<BatchConnection> {
        use std::os::unix::ffi::OsStrExt;
        let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|_| StoreError::Unavailable(format!("{} holds a NUL byte", path.display())))?;
        let mut db = null_mut();
        // SAFETY: `c_path` is NUL-terminated; SQLite writes a handle (or NULL when out of
        // memory) into `db` whatever the outcome.
        let rc = unsafe {
            ffi::sqlite3_open_v2(
                c_path.as_ptr(),
                &mut db,
                ffi::SQLITE_OPEN_READWRITE | ffi::SQLITE_OPEN_NOMUTEX | ffi::SQLITE_OPEN_EXRESCODE,
                std::ptr::null(),
            )
        };
        let db = NonNull::new(db).ok_or_else(|| StoreError::Unavailable("SQLite is out of memory".into()))?;
        // From here on the handle is closed when `conn` is dropped, also on an error below.
        let mut conn = BatchConnection {
            db,
            prepared: Vec::new(),
        };
        if rc != ffi::SQLITE_OK {
            return Err(error(db, rc));
        }
        // SAFETY: `db` is open and used by this thread alone.
        let rc = unsafe { ffi::sqlite3_busy_timeout(db.as_ptr(), busy_timeout_ms) };
        if rc != ffi::SQLITE_OK {
            return Err(error(db, rc));
        }
        let pragmas = format!(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON; \
             PRAGMA wal_autocheckpoint = 0; PRAGMA cache_size = {cache_size};"
        );
        let pragmas = std::ffi::CString::new(pragmas).expect("pragmas without NUL");
        conn.exec(&pragmas).map_err(tessera_store_sql::db)?;
        Ok(conn)
    }

    /// Runs `sql`, which takes no parameters (any rows it returns are dropped).
    fn exec(&mut self, sql: &CStr) -> DbResult<()> {
        // SAFETY: `db` is open and used by one thread at a time (`&mut self`); `sql` is
        // NUL-terminated; no callback, no error message to free.
        let rc = unsafe { ffi::sqlite3_exec(self.db.as_ptr(), sql.as_ptr(), None, null_mut(), null_mut()) };
        if rc == ffi::SQLITE_OK {
            Ok(())
        } else {
            Err(write_error(self.db, rc))
        }
    }

    /// The statement of `text`, prepared on first use.
    fn prepared(&mut self, text: &Arc<str>) -> DbResult<&mut Write> {
        let at = match self.prepared.iter().position(|(t, _)| Arc::ptr_eq(t, text)) {
            Some(at) => at,
            None => {
                let write = Write::prepare(self.db, text)?;
                self.prepared.push((text.clone(), write));
                self.prepared.len() - 1
            }
        };
        Ok(&mut self.prepared[at].1)
    }

    /// Whether a transaction is open on the handle.
    fn in_transaction(&self) -> bool {
        // SAFETY: as in `exec`.
        unsafe { ffi::sqlite3_get_autocommit(self.db.as_ptr()) == 0 }
    }

    /// Runs `statement` over the rows of `values` (each row's values in turn, in column
    /// order), at most [`crate::rows::PER_STATEMENT`] rows a statement, each with the text of
    /// `crate::rows` for its size; the rows they changed.
    fn run(&mut self, statement: &'static MultiRow, values: &[Value<'_>]) -> DbResult<u64> {
        let columns = statement.columns();
        let mut changed = 0;
        for chunk in values.chunks(crate::rows::PER_STATEMENT[0] * columns) {
            let rows = chunk.len() / columns;
            let text = crate::rows::text(statement, crate::rows::padded(rows));
            let db = self.db;
            let (n, _) = self.prepared(&text)?.run(db, chunk)?;
            tracing::debug!(target: "tessera_store_sqlite::write", statement = statement.head(), rows, changed = n);
            changed += n;
        }
        Ok(changed)
    }

    /// Writes `groups` in order, then `audit`, in one write transaction (`BEGIN IMMEDIATE`),
    /// as [`tessera_store_sql::Driver::commit_groups`] says: committed, `Ok(None)`; a counted
    /// group short of rows, rolled back and `Ok(Some(its index))`; an error, rolled back.
    pub(crate) fn write_batch(&mut self, groups: &[Group<'_>], audit: Option<&Group<'_>>) -> DbResult<Option<usize>> {
        self.exec(c"BEGIN IMMEDIATE")?;
        let written = self.write_in_transaction(groups, audit);
        let done = match written {
            Ok(None) => self.exec(c"COMMIT").map(|()| None),
            other => other,
        };
        // After an error, a short count or a failed commit: the handle leaves no transaction
        // open for the next batch.
        if self.in_transaction()
            && let Err(e) = self.exec(c"ROLLBACK")
        {
            tracing::error!(error = ?e, "rolling back a lifecycle batch failed");
        }
        done
    }

    fn write_in_transaction(&mut self, groups: &[Group<'_>], audit: Option<&Group<'_>>) -> DbResult<Option<usize>> {
        for (i, g) in groups.iter().enumerate() {
            let changed = self.run(g.statement, &g.values)?;
            if g.counted && changed != g.rows as u64 {
                return Ok(Some(i));
            }
        }
        if let Some(a) = audit {
            // The numbers come from the `audit` row of `sequences`, inside this transaction, as
            // `tessera_store_sql::audit::append` takes them.
            static NEXT_AUDIT: LazyLock<Arc<str>> = LazyLock::new(|| tessera_store_sql::audit::NEXT_NUMBERS.into());
            let n = i64::try_from(a.rows).expect("fewer than 2^63 records");
            let db = self.db;
            let (_, last) = self.prepared(&NEXT_AUDIT)?.run(db, &[Value::Int(Some(n))])?;
            let last = last.ok_or_else(|| StoreError::Corrupt("the `audit` sequence is missing".into()))?;
            let columns = a.statement.columns();
            let mut numbered = Vec::with_capacity(a.rows * (columns + 1));
            for (seq, record) in (last - n + 1..).zip(a.values.chunks(columns)) {
                numbered.push(Value::Int(Some(seq)));
                numbered.extend(record.iter().cloned());
            }
            self.run(&tessera_store_sql::audit::INSERT, &numbered)?;
        }
        Ok(None)
    }
}

impl Drop for BatchConnection {
    fn drop(&mut self) {
        // Every statement first: SQLite closes no handle with statements still prepared.
        self.prepared.clear();
        // SAFETY: the handle is open, no statement is left on it, and it is closed once, here.
        let rc = unsafe { ffi::sqlite3_close(self.db.as_ptr()) };
        if rc != ffi::SQLITE_OK {
            tracing::error!(rc, "closing the batch connection failed");
        }
    }
}

/// A statement that writes, prepared on a [`BatchConnection`]'s handle, which finalises it
/// before it closes.
struct Write {
    stmt: NonNull<ffi::sqlite3_stmt>,
    parameters: usize,
}

impl Write {
    fn prepare(db: NonNull<ffi::sqlite3>, sql: &str) -> DbResult<Write> {
        let mut stmt = null_mut();
        let len = c_int::try_from(sql.len()).expect("a statement shorter than 2 GiB");
        // SAFETY: `db` is open and used by this thread alone; `sql` is valid for `len` bytes and
        // SQLite copies what it keeps of it. `PERSISTENT`: the statement is kept for long.
        let rc = unsafe {
            ffi::sqlite3_prepare_v3(
                db.as_ptr(),
                sql.as_ptr().cast(),
                len,
                ffi::SQLITE_PREPARE_PERSISTENT as _,
                &mut stmt,
                null_mut(),
            )
        };
        if rc != ffi::SQLITE_OK {
            return Err(write_error(db, rc));
        }
        let stmt = NonNull::new(stmt).expect("a statement that is not empty");
        // SAFETY: `stmt` was just prepared on `db`.
        let parameters = unsafe { ffi::sqlite3_bind_parameter_count(stmt.as_ptr()) };
        Ok(Write {
            stmt,
            parameters: usize::try_from(parameters).unwrap_or(0),
        })
    }

    /// Runs the statement on `db`, the handle it was prepared on, with `values` as its first
    /// parameters and NULL for the rest; the rows it changed and the integer in the first
    /// column of the first row it returned, if any. The statement is reset for the next run.
    fn run(&mut self, db: NonNull<ffi::sqlite3>, values: &[Value<'_>]) -> DbResult<(u64, Option<i64>)> {
        assert!(
            values.len() <= self.parameters,
            "{} values for {} parameters",
            values.len(),
            self.parameters
        );
        let result = self.bind(db, values).and_then(|()| self.step_all(db));
        // SAFETY: the statement is prepared; resetting it ends its run whatever happened.
        unsafe {
            ffi::sqlite3_reset(self.stmt.as_ptr());
        }
        result
    }

    fn bind(&mut self, db: NonNull<ffi::sqlite3>, values: &[Value<'_>]) -> DbResult<()> {
        let stmt = self.stmt.as_ptr();
        for i in 0..self.parameters {
            let at = c_int::try_from(i + 1).expect("fewer than 2^31 parameters");
            // SAFETY: the statement is prepared and `at` is within its parameters. Text is
            // copied by SQLite (`SQLITE_TRANSIENT`), so no pointer into `values` is kept; every
            // parameter is bound, so none keeps a value of an earlier run.
            let rc = unsafe {
                match values.get(i) {
                    None | Some(Value::Int(None) | Value::Text(None) | Value::Flag(None) | Value::Float(None)) => {
                        ffi::sqlite3_bind_null(stmt, at)
                    }
                    Some(Value::Int(Some(v))) => ffi::sqlite3_bind_int64(stmt, at, *v),
                    Some(Value::Flag(Some(v))) => ffi::sqlite3_bind_int64(stmt, at, i64::from(*v)),
                    Some(Value::Float(Some(v))) => ffi::sqlite3_bind_double(stmt, at, *v),
                    Some(Value::Text(Some(v))) => {
                        let len = c_int::try_from(v.len()).expect("a text shorter than 2 GiB");
                        ffi::sqlite3_bind_text(stmt, at, v.as_ptr().cast(), len, ffi::SQLITE_TRANSIENT())
                    }
                }
            };
            if rc != ffi::SQLITE_OK {
                return Err(write_error(db, rc));
            }
        }
        Ok(())
    }

    fn step_all(&mut self, db: NonNull<ffi::sqlite3>) -> DbResult<(u64, Option<i64>)> {
        let mut first = None;
        loop {
            // SAFETY: the statement is prepared and its parameters bound.
            let rc = unsafe { ffi::sqlite3_step(self.stmt.as_ptr()) };
            match rc {
                ffi::SQLITE_ROW => {
                    if first.is_none() {
                        // SAFETY: the statement is on a row; a column that is not an integer
                        // reads as SQLite converts it (the callers' columns are integers).
                        first = Some(unsafe { ffi::sqlite3_column_int64(self.stmt.as_ptr(), 0) });
                    }
                }
                ffi::SQLITE_DONE => {
                    // SAFETY: `db` is open; the count is that of this statement, the last one
                    // completed on the handle.
                    let changed = unsafe { ffi::sqlite3_changes64(db.as_ptr()) };
                    return Ok((u64::try_from(changed).unwrap_or(0), first));
                }
                rc => return Err(write_error(db, rc)),
            }
        }
    }
}

impl Drop for Write {
    fn drop(&mut self) {
        // SAFETY: the statement is finalised once, here, before its handle closes
        // (`BatchConnection`'s drop).
        unsafe {
            ffi::sqlite3_finalize(self.stmt.as_ptr());
        }
    }
}

/// A failed write, classified as sqlx errors are (`crate::classify`): a unique or primary key
/// violated is [`DbError::UniqueViolation`], the rest as [`error`] says.
fn write_error(db: NonNull<ffi::sqlite3>, rc: c_int) -> DbError {
    // SAFETY: `db` is open and locked by the caller. sqlx turns extended result codes on for
    // its connections, so a statement's code says which constraint failed.
    let extended = unsafe { ffi::sqlite3_extended_errcode(db.as_ptr()) };
    match extended {
        ffi::SQLITE_CONSTRAINT_UNIQUE | ffi::SQLITE_CONSTRAINT_PRIMARYKEY => DbError::UniqueViolation,
        _ => DbError::Store(error(db, rc)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl BatchConnection {
        /// The integer a pragma reads.
        fn pragma(&mut self, name: &str) -> i64 {
            let mut read = Write::prepare(self.db, &format!("PRAGMA {name}")).unwrap();
            read.run(self.db, &[]).unwrap().1.unwrap()
        }
    }

    /// The batch connection writes as durably as the pool's: a commit is on disk before it
    /// is acknowledged, foreign keys hold, a busy writer is waited for, and checkpoints are
    /// left to the background checkpointer.
    #[tokio::test]
    async fn the_batch_connection_has_the_pools_settings() {
        let dir = std::env::temp_dir().join(format!("tessera-batch-connection-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = crate::SqliteStore::open_dir(&dir).await.unwrap();
        let batch = store
            .batch
            .clone()
            .expect("a file store writes batches on its own connection");
        let mut conn = batch.lock().await;
        // 2: FULL.
        assert_eq!(conn.pragma("synchronous"), 2);
        assert_eq!(conn.pragma("foreign_keys"), 1);
        assert_eq!(conn.pragma("wal_autocheckpoint"), 0);
        assert_eq!(conn.pragma("busy_timeout"), i64::from(crate::BUSY_TIMEOUT_MS));
        assert_eq!(conn.pragma("cache_size"), crate::WRITER_CACHE.parse::<i64>().unwrap());
        drop(conn);
        drop((batch, store));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A store in memory has no file for a second connection: its batches go through sqlx.
    #[tokio::test]
    async fn a_store_in_memory_has_no_batch_connection() {
        let store = crate::SqliteStore::open_memory().await.unwrap();
        assert!(store.batch.is_none());
    }
}
