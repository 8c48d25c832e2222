//! When a notification is tried again: the backoff after failed attempts,
//! and the wait a webhook asks for in `Retry-After`.

use std::time::Duration;

use super::deliver::{FIRST_RETRY, MAX_RETRY};

/// The wait after `attempts` failed attempts: [`FIRST_RETRY`] doubling,
/// at most [`MAX_RETRY`], with full jitter over its upper half so that
/// retries of many notifications do not arrive together.
pub(super) fn backoff(attempts: u32) -> Duration {
    let exp = FIRST_RETRY.saturating_mul(1 << attempts.saturating_sub(1).min(16));
    let cap = exp.min(MAX_RETRY);
    cap.mul_f64(0.5 + fastrand::f64() / 2.0)
}

/// `Retry-After`: seconds, or an HTTP date.
pub(super) fn retry_after(value: &str) -> Option<Duration> {
    if let Ok(seconds) = value.trim().parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(
        at.duration_since(std::time::SystemTime::now())
            .unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_up_to_the_cap() {
        for attempts in 1..20 {
            let wait = backoff(attempts);
            let cap = FIRST_RETRY
                .saturating_mul(1 << (attempts - 1).min(16))
                .min(MAX_RETRY);
            assert!(
                wait >= cap / 2 && wait <= cap,
                "{attempts}: {wait:?} of {cap:?}"
            );
        }
        assert_eq!(retry_after("7"), Some(Duration::from_secs(7)));
        assert_eq!(retry_after("soon"), None);
        let past = httpdate::fmt_http_date(std::time::SystemTime::UNIX_EPOCH);
        assert_eq!(retry_after(&past), Some(Duration::ZERO));
    }
}
