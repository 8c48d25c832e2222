//! Opaque ListTasks page tokens.
//!
//! A cursor is the sort key of the last task on a page: (status timestamp,
//! task id). The next page starts strictly after it in the order
//! "timestamp descending, id ascending", so tasks created between pages
//! (newer timestamps) sort before the cursor and neither shift nor repeat
//! the remaining pages. Tokens are URL-safe base64 so clients treat them as
//! opaque; a token that does not decode is a validation error.

use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};

/// Where the next page starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub status_nanos: i64,
    pub task_id: String,
}

const VERSION_PREFIX: &str = "v1:";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("page_token is not a token this server issued")]
pub struct BadPageToken;

impl Cursor {
    pub fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(format!(
            "{VERSION_PREFIX}{}:{}",
            self.status_nanos, self.task_id
        ))
    }

    pub fn decode(token: &str) -> Result<Cursor, BadPageToken> {
        let bytes = URL_SAFE_NO_PAD.decode(token).map_err(|_| BadPageToken)?;
        let text = String::from_utf8(bytes).map_err(|_| BadPageToken)?;
        let rest = text.strip_prefix(VERSION_PREFIX).ok_or(BadPageToken)?;
        let (nanos, id) = rest.split_once(':').ok_or(BadPageToken)?;
        let status_nanos = nanos.parse().map_err(|_| BadPageToken)?;
        if id.is_empty() {
            return Err(BadPageToken);
        }
        Ok(Cursor {
            status_nanos,
            task_id: id.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let c = Cursor {
            status_nanos: 1_700_000_000_123_456_789,
            task_id: "a:b-c".into(),
        };
        assert_eq!(Cursor::decode(&c.encode()), Ok(c));
    }

    #[test]
    fn garbage_is_refused() {
        for token in [
            "",
            "!!",
            "djE6",
            "eDox",
            &URL_SAFE_NO_PAD.encode("v1:x:id"),
            &URL_SAFE_NO_PAD.encode("v1:5:"),
        ] {
            assert_eq!(Cursor::decode(token), Err(BadPageToken), "{token}");
        }
    }
}
