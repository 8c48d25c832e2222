//! What differs between the SQL backends' statements, and each backend's
//! answer: how a value is bound and written, how the empty byte string is
//! spelled, and how a (seconds, nanos) pair is compared.

use tokio_postgres::types::ToSql;

use super::Sql;

/// A value bound to a statement, before a dialect takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Param {
    Bytes(Vec<u8>),
    /// An `INT8` (`BIGINT`).
    Int8(i64),
    /// An `INT4`: PostgreSQL's `state` and `status_nanos` columns.
    Int4(i32),
}

impl From<Vec<u8>> for Param {
    fn from(bytes: Vec<u8>) -> Self {
        Param::Bytes(bytes)
    }
}

impl From<i64> for Param {
    fn from(n: i64) -> Self {
        Param::Int8(n)
    }
}

impl From<i32> for Param {
    fn from(n: i32) -> Self {
        Param::Int4(n)
    }
}

/// One SQL backend's way of writing what the shared statements say.
pub(crate) trait Dialect {
    /// A bound value, as the backend's driver takes it.
    type Value;
    /// The empty byte string as a literal (an unowned task's `owner`).
    const EMPTY_BYTES: &'static str;
    /// Whether a (seconds, nanos) pair is compared as a row value,
    /// `(a, b) < (x, y)`; otherwise it is spelled out column by column.
    const ROW_VALUES: bool;
    /// Appends the placeholder of the `n`th value bound (from 1).
    fn placeholder(text: &mut String, n: usize);
    /// `param` as the driver takes it.
    fn value(param: Param) -> Self::Value;
}

/// SQLite's dialect: `?` placeholders, rusqlite values, and time
/// comparisons spelled out, with which its planner seeks an index.
pub(crate) struct Sqlite;

impl Dialect for Sqlite {
    type Value = rusqlite::types::Value;
    const EMPTY_BYTES: &'static str = "x''";
    const ROW_VALUES: bool = false;

    fn placeholder(text: &mut String, _: usize) {
        text.push('?');
    }

    fn value(param: Param) -> Self::Value {
        use rusqlite::types::Value;
        match param {
            Param::Bytes(bytes) => Value::Blob(bytes),
            Param::Int8(n) => Value::Integer(n),
            Param::Int4(n) => Value::Integer(n.into()),
        }
    }
}

/// PostgreSQL's dialect: `$n` placeholders, tokio-postgres values typed
/// as their columns are (an `INT4` column takes no `i64`), and row-value
/// comparisons, which its planner seeks an index by.
pub(crate) struct Postgres;

impl Dialect for Postgres {
    type Value = Box<dyn ToSql + Sync + Send>;
    const EMPTY_BYTES: &'static str = "''::bytea";
    const ROW_VALUES: bool = true;

    fn placeholder(text: &mut String, n: usize) {
        text.push_str(&format!("${n}"));
    }

    fn value(param: Param) -> Self::Value {
        match param {
            Param::Bytes(bytes) => Box::new(bytes),
            Param::Int8(n) => Box::new(n),
            Param::Int4(n) => Box::new(n),
        }
    }
}

impl Sql<Postgres> {
    /// The values as tokio-postgres takes a statement's parameters.
    pub fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.values
            .iter()
            .map(|v| v.as_ref() as &(dyn ToSql + Sync))
            .collect()
    }
}
