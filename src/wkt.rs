//! The protobuf well-known types `a2a.proto` uses (`Timestamp`, `Struct`,
//! `Value`, `ListValue`, `NullValue`), with their ProtoJSON forms.
//!
//! The generated protocol types hold these instead of
//! `prost_types`' so that every message has a generated serde codec
//! (pbjson-build, `build.rs`): serde traits cannot be added to another
//! crate's types. Wire-identical to `prost_types` (same tags), with the
//! same conversions; `Struct` keeps a `BTreeMap`, so its JSON has one key
//! order (cards hash and sign the same bytes on every start).
//!
//! ProtoJSON (spec §5.5, §5.6.1; protobuf's JSON mapping):
//! - `Timestamp`: RFC 3339 in UTC with `Z` and 0, 3, 6 or 9 fractional
//!   digits; read with any offset, as protobuf's parsers do.
//! - `Struct`: a JSON object; `Value`: any JSON value; `ListValue`: an
//!   array; `NullValue`: `null`. A number is a double: NaN and the
//!   infinities have no JSON form and are refused when written.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Error as _, SerializeMap, SerializeSeq, Serializer};
use serde::{Deserialize, Serialize};

/// `google.protobuf.Timestamp`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Message)]
pub struct Timestamp {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

/// `google.protobuf.Struct`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Struct {
    #[prost(btree_map = "string, message", tag = "1")]
    pub fields: BTreeMap<String, Value>,
}

/// `google.protobuf.Value`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Value {
    #[prost(oneof = "value::Kind", tags = "1, 2, 3, 4, 5, 6")]
    pub kind: Option<value::Kind>,
}

/// `google.protobuf.ListValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListValue {
    #[prost(message, repeated, tag = "1")]
    pub values: Vec<Value>,
}

/// `google.protobuf.NullValue`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum NullValue {
    NullValue = 0,
}

pub mod value {
    /// The kind of a [`Value`](super::Value).
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Kind {
        #[prost(enumeration = "super::NullValue", tag = "1")]
        NullValue(i32),
        #[prost(double, tag = "2")]
        NumberValue(f64),
        #[prost(string, tag = "3")]
        StringValue(String),
        #[prost(bool, tag = "4")]
        BoolValue(bool),
        #[prost(message, tag = "5")]
        StructValue(super::Struct),
        #[prost(message, tag = "6")]
        ListValue(super::ListValue),
    }
}

macro_rules! named {
    ($($ty:ident),*) => {$(
        impl prost::Name for $ty {
            const NAME: &'static str = stringify!($ty);
            const PACKAGE: &'static str = "google.protobuf";
            fn full_name() -> String {
                concat!("google.protobuf.", stringify!($ty)).into()
            }
            fn type_url() -> String {
                concat!("type.googleapis.com/google.protobuf.", stringify!($ty)).into()
            }
        }
    )*};
}
named!(Timestamp, Struct, Value, ListValue);

// Timestamps: the calendar arithmetic is prost-types', on the same fields.

impl From<Timestamp> for prost_types::Timestamp {
    fn from(t: Timestamp) -> Self {
        prost_types::Timestamp {
            seconds: t.seconds,
            nanos: t.nanos,
        }
    }
}

impl From<prost_types::Timestamp> for Timestamp {
    fn from(t: prost_types::Timestamp) -> Self {
        Timestamp {
            seconds: t.seconds,
            nanos: t.nanos,
        }
    }
}

impl From<std::time::SystemTime> for Timestamp {
    fn from(t: std::time::SystemTime) -> Self {
        prost_types::Timestamp::from(t).into()
    }
}

impl TryFrom<Timestamp> for std::time::SystemTime {
    type Error = prost_types::TimestampError;
    fn try_from(t: Timestamp) -> Result<Self, Self::Error> {
        std::time::SystemTime::try_from(prost_types::Timestamp::from(t))
    }
}

impl Timestamp {
    /// Carries whole seconds out of `nanos` and makes `nanos`
    /// non-negative, saturating at the ends of the `i64` range.
    pub fn normalize(&mut self) {
        let mut t = prost_types::Timestamp::from(*self);
        t.normalize();
        *self = t.into();
    }

    /// Within protobuf's range (0001-01-01 to 9999-12-31, spec §5.6.1):
    /// what has a ProtoJSON form.
    pub fn is_valid(&self) -> bool {
        const MIN: i64 = -62_135_596_800;
        const MAX: i64 = 253_402_300_799;
        (MIN..=MAX).contains(&self.seconds) && (0..1_000_000_000).contains(&self.nanos)
    }
}

impl FromStr for Timestamp {
    type Err = prost_types::TimestampError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        prost_types::Timestamp::from_str(s).map(Into::into)
    }
}

/// RFC 3339 in UTC (`Z`), with 0, 3, 6 or 9 fractional digits.
impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        prost_types::Timestamp::from(*self).fmt(f)
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if !self.is_valid() {
            return Err(S::Error::custom(format!(
                "timestamp {}s {}ns is outside 0001-01-01T00:00:00Z..9999-12-31T23:59:59Z",
                self.seconds, self.nanos
            )));
        }
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Timestamp;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an RFC 3339 timestamp string")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Timestamp, E> {
                let t = Timestamp::from_str(s)
                    .map_err(|_| E::custom(format!("{s:?} is not an RFC 3339 timestamp")))?;
                if !t.is_valid() {
                    return Err(E::custom(format!(
                        "{s:?} is outside 0001-01-01T00:00:00Z..9999-12-31T23:59:59Z"
                    )));
                }
                Ok(t)
            }
        }
        deserializer.deserialize_str(V)
    }
}

// Values: the conversions prost-types offers.

impl From<value::Kind> for Value {
    fn from(kind: value::Kind) -> Self {
        Value { kind: Some(kind) }
    }
}

macro_rules! number_value {
    ($($t:ty),*) => {$(
        impl From<$t> for Value {
            fn from(n: $t) -> Self {
                value::Kind::NumberValue(n.into()).into()
            }
        }
    )*};
}
number_value!(u8, u16, u32, i8, i16, i32, f32, f64);

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        value::Kind::BoolValue(b).into()
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        value::Kind::StringValue(s).into()
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        value::Kind::StringValue(s.into()).into()
    }
}

impl From<Vec<Value>> for Value {
    fn from(values: Vec<Value>) -> Self {
        value::Kind::ListValue(ListValue { values }).into()
    }
}

impl From<BTreeMap<String, Value>> for Value {
    fn from(fields: BTreeMap<String, Value>) -> Self {
        value::Kind::StructValue(Struct { fields }).into()
    }
}

impl From<Struct> for Value {
    fn from(s: Struct) -> Self {
        value::Kind::StructValue(s).into()
    }
}

impl Serialize for Struct {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.fields.len()))?;
        for (k, v) in &self.fields {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl Serialize for ListValue {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.values.len()))?;
        for v in &self.values {
            seq.serialize_element(v)?;
        }
        seq.end()
    }
}

impl Serialize for Value {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use value::Kind;
        match &self.kind {
            None | Some(Kind::NullValue(_)) => serializer.serialize_unit(),
            Some(Kind::NumberValue(n)) if !n.is_finite() => Err(S::Error::custom(format!(
                "a google.protobuf.Value number of {n} has no JSON form"
            ))),
            // Protobuf's printers write an integral double as an integer
            // (`42`, not `42.0`), as JavaScript does.
            Some(Kind::NumberValue(n)) if n.fract() == 0.0 && n.abs() < 9_007_199_254_740_992.0 => {
                serializer.serialize_i64(*n as i64)
            }
            Some(Kind::NumberValue(n)) => serializer.serialize_f64(*n),
            Some(Kind::StringValue(s)) => serializer.serialize_str(s),
            Some(Kind::BoolValue(b)) => serializer.serialize_bool(*b),
            Some(Kind::StructValue(s)) => s.serialize(serializer),
            Some(Kind::ListValue(l)) => l.serialize(serializer),
        }
    }
}

impl Serialize for NullValue {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_unit()
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(value::Kind::NullValue(NullValue::NullValue as i32).into())
    }
    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        self.visit_unit()
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Value, E> {
        Ok(b.into())
    }
    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Value, E> {
        Ok(value::Kind::NumberValue(n as f64).into())
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Value, E> {
        Ok(value::Kind::NumberValue(n as f64).into())
    }
    fn visit_f64<E: de::Error>(self, n: f64) -> Result<Value, E> {
        Ok(n.into())
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Value, E> {
        Ok(s.into())
    }
    fn visit_string<E: de::Error>(self, s: String) -> Result<Value, E> {
        Ok(s.into())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut values = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(v) = seq.next_element::<Value>()? {
            values.push(v);
        }
        Ok(values.into())
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Value, A::Error> {
        Ok(StructVisitor.visit_map(map)?.into())
    }
}

struct StructVisitor;

impl<'de> Visitor<'de> for StructVisitor {
    type Value = Struct;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Struct, A::Error> {
        let mut fields = BTreeMap::new();
        while let Some((k, v)) = map.next_entry::<String, Value>()? {
            fields.insert(k, v);
        }
        Ok(Struct { fields })
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ValueVisitor)
    }
}

impl<'de> Deserialize<'de> for Struct {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(StructVisitor)
    }
}

impl<'de> Deserialize<'de> for ListValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let values = Vec::<Value>::deserialize(deserializer)?;
        Ok(ListValue { values })
    }
}

impl<'de> Deserialize<'de> for NullValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // ProtoJSON: `null`, or the enum's name.
        struct V;
        impl Visitor<'_> for V {
            type Value = NullValue;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("null")
            }
            fn visit_unit<E: de::Error>(self) -> Result<NullValue, E> {
                Ok(NullValue::NullValue)
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<NullValue, E> {
                match s {
                    "NULL_VALUE" => Ok(NullValue::NullValue),
                    _ => Err(E::custom(format!("{s:?} is not a NullValue"))),
                }
            }
        }
        deserializer.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_utc_with_z() {
        let t = Timestamp {
            seconds: 1_700_000_000,
            nanos: 120_000_000,
        };
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(json, r#""2023-11-14T22:13:20.120Z""#);
        let back: Timestamp = serde_json::from_str(r#""2023-11-14T23:13:20.12+01:00""#).unwrap();
        assert_eq!(back, t);
        assert!(serde_json::from_str::<Timestamp>(r#""yesterday""#).is_err());
        assert!(
            serde_json::to_string(&Timestamp {
                seconds: i64::MAX,
                nanos: 0
            })
            .is_err()
        );
    }

    #[test]
    fn values_are_any_json_and_structs_keep_one_key_order() {
        let text = r#"{"b":[1.5,true,null,"x"],"a":{"n":2}}"#;
        let s: Struct = serde_json::from_str(text).unwrap();
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"a":{"n":2},"b":[1.5,true,null,"x"]}"#
        );
        let nan = Value::from(f64::NAN);
        assert!(serde_json::to_string(&nan).is_err());
        // Wire-identical to prost-types.
        let ours = prost::Message::encode_to_vec(&s);
        let theirs: prost_types::Struct = prost::Message::decode(ours.as_slice()).unwrap();
        assert_eq!(theirs.fields.len(), 2);
    }
}
