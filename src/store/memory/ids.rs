//! How the memory store keeps ids and status times compactly: a
//! canonical lowercase UUID as its 16 bytes, a time in 12 bytes that sort
//! as it does.

use std::cmp::Ordering;

use crate::store::TimeKey;

/// A task id or context id as an entry keeps it: a canonical lowercase
/// UUID, which this server mints for both, as its 16 bytes (24 with the
/// tag, against a 16-byte pointer and a 40-byte allocation as text); any
/// other string as it is. Which form a string takes depends on it alone,
/// so equal strings have equal `Id`s; an uppercase UUID stays text and
/// reads back uppercase.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Id {
    Uuid([u8; 16]),
    Text(Box<str>),
}

/// An [`Id`] borrowed, or read from a caller's string without allocating.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum IdRef<'a> {
    Uuid([u8; 16]),
    Text(&'a str),
}

/// The bytes of `s` if it is a UUID as this server writes it: 36
/// characters, 8-4-4-4-12 lowercase hex digits.
pub(super) fn uuid_bytes(s: &str) -> Option<[u8; 16]> {
    pub(super) fn hex(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        }
    }
    let s = s.as_bytes();
    if s.len() != 36 {
        return None;
    }
    let mut bytes = [0u8; 16];
    let mut at = 0;
    for byte in &mut bytes {
        if matches!(at, 8 | 13 | 18 | 23) {
            if s[at] != b'-' {
                return None;
            }
            at += 1;
        }
        *byte = hex(s[at])? << 4 | hex(s[at + 1])?;
        at += 2;
    }
    Some(bytes)
}

impl Id {
    pub(super) fn new(s: &str) -> Id {
        match uuid_bytes(s) {
            Some(bytes) => Id::Uuid(bytes),
            None => Id::Text(s.into()),
        }
    }

    pub(super) fn as_ref(&self) -> IdRef<'_> {
        match self {
            Id::Uuid(bytes) => IdRef::Uuid(*bytes),
            Id::Text(text) => IdRef::Text(text),
        }
    }
}

impl<'a> IdRef<'a> {
    pub(super) fn of(s: &'a str) -> IdRef<'a> {
        match uuid_bytes(s) {
            Some(bytes) => IdRef::Uuid(bytes),
            None => IdRef::Text(s),
        }
    }

    /// The string, written into `buf` for a UUID.
    pub(super) fn as_str<'b>(&self, buf: &'b mut [u8; 36]) -> &'b str
    where
        'a: 'b,
    {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        match *self {
            IdRef::Text(text) => text,
            IdRef::Uuid(bytes) => {
                let mut at = 0;
                for (i, byte) in bytes.iter().enumerate() {
                    if matches!(i, 4 | 6 | 8 | 10) {
                        buf[at] = b'-';
                        at += 1;
                    }
                    buf[at] = HEX[usize::from(byte >> 4)];
                    buf[at + 1] = HEX[usize::from(byte & 0xf)];
                    at += 2;
                }
                std::str::from_utf8(&buf[..]).expect("hex digits and hyphens")
            }
        }
    }

    /// The order of the strings' bytes (spec §3.1.4's ties). Two UUIDs
    /// compare as their bytes, which is the order of their lowercase hex.
    pub(super) fn cmp_str(self, other: IdRef<'_>) -> Ordering {
        match (self, other) {
            (IdRef::Uuid(a), IdRef::Uuid(b)) => a.cmp(&b),
            (a, b) => a.as_str(&mut [0; 36]).cmp(b.as_str(&mut [0; 36])),
        }
    }
}

impl std::fmt::Display for IdRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str(&mut [0; 36]))
    }
}

/// A status time packed in 12 bytes whose byte order is the time's order
/// ([`TimeKey`], 16 bytes with its padding): the ListTasks index holds one
/// per task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct Time([u8; 12]);

impl Time {
    pub(super) fn new((seconds, nanos): TimeKey) -> Time {
        let mut bytes = [0u8; 12];
        // The sign bits flipped: negatives sort before positives.
        bytes[..8].copy_from_slice(&((seconds as u64) ^ (1 << 63)).to_be_bytes());
        bytes[8..].copy_from_slice(&((nanos as u32) ^ (1 << 31)).to_be_bytes());
        Time(bytes)
    }
}
