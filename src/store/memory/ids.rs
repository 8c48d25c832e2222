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
    let s: &[u8; 36] = s.as_bytes().try_into().ok()?;
    if [s[8], s[13], s[18], s[23]] != [b'-'; 4] {
        return None;
    }
    // Table lookups and one check at the end, not a branch per digit:
    // every task write parses its ids (a branch per digit cost about 440
    // instructions an id).
    let mut bytes = [0u8; 16];
    let mut invalid = 0;
    for (byte, at) in bytes.iter_mut().zip(DIGIT_AT) {
        let (high, low) = (
            HEX_VALUE[usize::from(s[at])],
            HEX_VALUE[usize::from(s[at + 1])],
        );
        invalid |= high | low;
        *byte = high << 4 | low;
    }
    (invalid & NOT_HEX == 0).then_some(bytes)
}

/// Where each byte's two digits start in a UUID's text.
const DIGIT_AT: [usize; 16] = [0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34];

/// Marks a character that is no lowercase hex digit in [`HEX_VALUE`].
const NOT_HEX: u8 = 0x10;

/// A lowercase hex digit's value; [`NOT_HEX`] for any other character.
const HEX_VALUE: [u8; 256] = {
    let mut table = [NOT_HEX; 256];
    let mut c = 0;
    while c < 10 {
        table[b'0' as usize + c] = c as u8;
        c += 1;
    }
    let mut c = 0;
    while c < 6 {
        table[b'a' as usize + c] = 10 + c as u8;
        c += 1;
    }
    table
};

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_canonical_uuid_is_kept_as_its_bytes_and_reads_back() {
        let text = "0192f3a4-5b6c-7d8e-9fa0-b1c2d3e4f5a6";
        let id = Id::new(text);
        assert_eq!(
            id,
            Id::Uuid([
                0x01, 0x92, 0xf3, 0xa4, 0x5b, 0x6c, 0x7d, 0x8e, 0x9f, 0xa0, 0xb1, 0xc2, 0xd3, 0xe4,
                0xf5, 0xa6
            ])
        );
        assert_eq!(id.as_ref().to_string(), text);
        for minted in (0..100).map(|_| uuid::Uuid::now_v7().to_string()) {
            assert_eq!(Id::new(&minted).as_ref().to_string(), minted);
            assert!(matches!(Id::new(&minted), Id::Uuid(_)));
        }
    }

    /// Anything else stays text, exactly as given: each digit position
    /// with each character next to the hex ranges, an uppercase digit,
    /// a missing or moved dash, another length.
    #[test]
    fn anything_else_stays_text() {
        let text = "0192f3a4-5b6c-7d8e-9fa0-b1c2d3e4f5a6";
        let mut others = vec![
            text.to_uppercase(),
            text.replace('-', ""),
            format!("{text}0"),
            text[1..].to_owned(),
            "0192f3a45-b6c-7d8e-9fa0-b1c2d3e4f5a6".to_owned(),
            String::new(),
        ];
        for at in (0..36).filter(|at| ![8, 13, 18, 23].contains(at)) {
            for c in ['/', ':', '`', 'g', 'A', 'F', '-', ' '] {
                let mut bytes = text.as_bytes().to_vec();
                bytes[at] = c as u8;
                others.push(String::from_utf8(bytes).unwrap());
            }
        }
        for other in others {
            assert_eq!(uuid_bytes(&other), None, "{other:?}");
            assert_eq!(Id::new(&other), Id::Text(other.clone().into()));
            assert_eq!(Id::new(&other).as_ref().to_string(), other);
        }
    }
}
