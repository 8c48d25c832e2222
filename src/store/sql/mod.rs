//! The SQL both SQL backends share: statements built a piece at a time
//! ([`Sql`]) in either backend's [`Dialect`], the ListTasks query, and the
//! task states as SQL.

mod dialect;
mod list;
mod states;

pub(crate) use dialect::{Dialect, Param, Postgres, Sqlite};
pub(crate) use list::{count_query, page_query};
pub(crate) use states::{
    OPEN_STATES_SQL, OPEN_STATES_SQLITE, WAITING_STATES_SQL, counted, state_list, unfinished_counts,
};

/// A statement and the values bound to it, built a piece at a time (the
/// ListTasks filters are optional), its placeholders numbered or not as
/// dialect `D` writes them.
pub(crate) struct Sql<D: Dialect> {
    pub text: String,
    pub values: Vec<D::Value>,
}

impl<D: Dialect> Sql<D> {
    pub fn new(text: &str) -> Self {
        Sql {
            text: text.to_owned(),
            values: Vec::new(),
        }
    }

    pub fn push(&mut self, text: &str) -> &mut Self {
        self.text.push_str(text);
        self
    }

    /// Binds `value` where the text has got to.
    pub fn bind(&mut self, value: impl Into<Param>) -> &mut Self {
        self.values.push(D::value(value.into()));
        D::placeholder(&mut self.text, self.values.len());
        self
    }
}
