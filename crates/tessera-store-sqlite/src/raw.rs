//! A statement stepped directly on a connection's SQLite handle, for reads of many rows.
//!
//! sqlx copies every value of every row into its own allocation and hands each row from its
//! worker thread to the async side; reading 100,000 workloads of 55 columns that way is most of
//! a restart. [`Statement`] steps a prepared statement on the connection's own handle (sqlx's
//! [`LockedSqliteHandle`](sqlx::sqlite::LockedSqliteHandle), which parks the worker meanwhile)
//! and lends each cell to the caller, who decodes it before the next step. Only statements
//! without parameters are needed and offered.
//!
//! This is the crate's only `unsafe` code; each block states why it holds.

use std::ffi::{CStr, c_int};
use std::marker::PhantomData;
use std::ptr::{NonNull, null_mut};

use libsqlite3_sys as ffi;
use sqlx::sqlite::LockedSqliteHandle;
use tessera_store::{Result, StoreError};

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
