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
    /// The status timestamp of the last task returned, as (seconds, nanos).
    pub status: super::TimeKey,
    pub task_id: String,
}

const VERSION_PREFIX: &str = "v2:";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("page_token is not a token this server issued")]
pub struct BadPageToken;

impl Cursor {
    pub fn encode(&self) -> String {
        let (seconds, nanos) = self.status;
        URL_SAFE_NO_PAD.encode(format!(
            "{VERSION_PREFIX}{seconds}:{nanos}:{}",
            self.task_id
        ))
    }

    pub fn decode(token: &str) -> Result<Cursor, BadPageToken> {
        let bytes = URL_SAFE_NO_PAD.decode(token).map_err(|_| BadPageToken)?;
        let text = String::from_utf8(bytes).map_err(|_| BadPageToken)?;
        let rest = text.strip_prefix(VERSION_PREFIX).ok_or(BadPageToken)?;
        let mut fields = rest.splitn(3, ':');
        let seconds: i64 = fields
            .next()
            .and_then(|f| f.parse().ok())
            .ok_or(BadPageToken)?;
        let nanos: i32 = fields
            .next()
            .and_then(|f| f.parse().ok())
            .ok_or(BadPageToken)?;
        let id = fields.next().ok_or(BadPageToken)?;
        if id.is_empty() || !(0..1_000_000_000).contains(&nanos) {
            return Err(BadPageToken);
        }
        Ok(Cursor {
            status: (seconds, nanos),
            task_id: id.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for status in [
            (1_700_000_000, 123_456_789),
            (-62_135_596_800, 0),
            (253_402_300_799, 999_999_999),
        ] {
            let c = Cursor {
                status,
                task_id: "a:b-c".into(),
            };
            assert_eq!(Cursor::decode(&c.encode()), Ok(c));
        }
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
