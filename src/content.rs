//! ContentTypeNotSupportedError (spec §3.3.2, §5.4): a message part whose
//! media type the agent's card does not accept is refused with
//! `INVALID_ARGUMENT`, reason `CONTENT_TYPE_NOT_SUPPORTED`, before anything
//! else is done with the message.
//!
//! - **What a card accepts** (spec §4.4.1, §4.4.5): its
//!   `default_input_modes` plus every skill's `input_modes`. Entries are
//!   media types (`text/plain`), or wildcards: `*/*` (anything) and
//!   `type/*` (any subtype of `type`). [`InputModes::of`] reads them once,
//!   when the cards are built; checking a message allocates nothing unless
//!   it is refused.
//! - **A part's media type**: its `media_type` field when set, otherwise
//!   the one its kind implies: text `text/plain`, data
//!   `application/json`, raw bytes and urls `application/octet-stream`.
//! - **Comparison**: on the essence (`type/subtype`), case-insensitively,
//!   parameters ignored: `Text/Plain; charset=utf-8` is `text/plain`.
//!
//! A part with no content is left to request validation, which reports it
//! on its own field.

use crate::error::A2aError;
use crate::proto::{AgentCard, Message, Part, part::Content};

/// The media type a text part without `media_type` carries.
pub const TEXT_MEDIA_TYPE: &str = "text/plain";
/// The media type a data part without `media_type` carries.
pub const DATA_MEDIA_TYPE: &str = "application/json";
/// The media type a raw-bytes or url part without `media_type` carries.
pub const FILE_MEDIA_TYPE: &str = "application/octet-stream";

/// The input media types one agent accepts, read off its card.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InputModes {
    /// The card's entries, in card order, without repeats: what the error
    /// tells the client it may send.
    declared: Vec<String>,
    /// `*/*` is among them.
    any: bool,
    /// The types of the `type/*` entries, lower-cased.
    wildcard_types: Vec<String>,
    /// The other entries' essences, lower-cased.
    exact: Vec<String>,
}

impl InputModes {
    /// What `card` accepts: its default input modes and every skill's.
    pub fn of(card: &AgentCard) -> Self {
        let mut modes = InputModes::default();
        let skill_modes = card.skills.iter().flat_map(|s| s.input_modes.iter());
        for entry in card.default_input_modes.iter().chain(skill_modes) {
            modes.add(entry);
        }
        modes
    }

    fn add(&mut self, entry: &str) {
        let entry = entry.trim();
        if entry.is_empty() || self.declared.iter().any(|d| d == entry) {
            return;
        }
        self.declared.push(entry.to_owned());
        let essence = essence(entry).to_ascii_lowercase();
        match essence.split_once('/') {
            Some(("*", "*")) => self.any = true,
            Some((ty, "*")) if !ty.is_empty() => self.wildcard_types.push(ty.to_owned()),
            _ => self.exact.push(essence),
        }
    }

    /// The card's entries, as it lists them (without repeats).
    pub fn declared(&self) -> &[String] {
        &self.declared
    }

    /// Whether a part of `media_type` (parameters allowed) is accepted.
    pub fn accepts(&self, media_type: &str) -> bool {
        if self.any {
            return true;
        }
        let essence = essence(media_type);
        if self.exact.iter().any(|e| e.eq_ignore_ascii_case(essence)) {
            return true;
        }
        match essence.split_once('/') {
            Some((ty, subtype)) if !ty.is_empty() && !subtype.is_empty() => self
                .wildcard_types
                .iter()
                .any(|w| w.eq_ignore_ascii_case(ty)),
            _ => false,
        }
    }

    /// Refuses the first part of `message` whose media type is not
    /// accepted, naming it (`message.parts[i]`, or
    /// `message.parts[i].media_type` when the type came from that field).
    pub fn check(&self, message: &Message) -> Result<(), A2aError> {
        if self.any {
            return Ok(());
        }
        for (i, part) in message.parts.iter().enumerate() {
            let Some((media_type, from_field)) = part_media_type(part) else {
                continue;
            };
            if !self.accepts(media_type) {
                let field = if from_field {
                    format!("message.parts[{i}].media_type")
                } else {
                    format!("message.parts[{i}]")
                };
                return Err(A2aError::ContentTypeNotSupported {
                    field,
                    media_type: media_type.to_owned(),
                    accepted: self.declared.clone(),
                });
            }
        }
        Ok(())
    }
}

/// A part's media type and whether it came from its `media_type` field
/// (otherwise its kind implies it); `None` for a part with neither content
/// nor media type, which validation refuses on its own.
pub fn part_media_type(part: &Part) -> Option<(&str, bool)> {
    if !part.media_type.trim().is_empty() {
        return Some((part.media_type.as_str(), true));
    }
    let implied = match part.content.as_ref()? {
        Content::Text(_) => TEXT_MEDIA_TYPE,
        Content::Data(_) => DATA_MEDIA_TYPE,
        Content::Raw(_) | Content::Url(_) => FILE_MEDIA_TYPE,
    };
    Some((implied, false))
}

/// The essence of a media type (RFC 9110 §8.3.1): `type/subtype`, without
/// parameters and surrounding whitespace.
pub fn essence(media_type: &str) -> &str {
    media_type
        .split_once(';')
        .map_or(media_type, |(essence, _)| essence)
        .trim()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::AgentSkill;

    fn card(defaults: &[&str], skills: &[&[&str]]) -> AgentCard {
        AgentCard {
            default_input_modes: defaults.iter().map(|m| (*m).into()).collect(),
            skills: skills
                .iter()
                .map(|modes| AgentSkill {
                    input_modes: modes.iter().map(|m| (*m).into()).collect(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn part(content: Content, media_type: &str) -> Part {
        Part {
            content: Some(content),
            media_type: media_type.into(),
            ..Default::default()
        }
    }

    #[test]
    fn defaults_and_every_skill_are_accepted_once_each() {
        let modes = InputModes::of(&card(
            &["text/plain"],
            &[&["text/x-diff", "text/plain"], &[" image/* "]],
        ));
        assert_eq!(modes.declared(), ["text/plain", "text/x-diff", "image/*"]);
        for ok in ["text/plain", "text/x-diff", "image/png", "IMAGE/JPEG"] {
            assert!(modes.accepts(ok), "{ok}");
        }
        for no in ["application/json", "text/html", "image", "image/", "", "x"] {
            assert!(!modes.accepts(no), "{no:?}");
        }
    }

    #[test]
    fn essence_ignores_case_parameters_and_whitespace() {
        let modes = InputModes::of(&card(&["Text/Plain; charset=us-ascii"], &[]));
        for ok in [
            "text/plain",
            "TEXT/PLAIN",
            "text/plain; charset=utf-8",
            " text/plain ;format=flowed",
        ] {
            assert!(modes.accepts(ok), "{ok:?}");
        }
        assert!(!modes.accepts("text/plainer"));
    }

    #[test]
    fn any_accepts_everything() {
        let modes = InputModes::of(&card(&["*/*"], &[]));
        assert!(modes.accepts("application/x-anything"));
        assert!(modes.accepts("not a media type"));
    }

    #[test]
    fn a_card_without_modes_accepts_nothing() {
        let modes = InputModes::of(&card(&[], &[]));
        assert!(!modes.accepts("text/plain"));
    }

    #[test]
    fn kinds_imply_media_types() {
        let data = Content::Data(crate::wkt::Value::from(1.0));
        assert_eq!(
            part_media_type(&part(Content::Text("t".into()), "")),
            Some(("text/plain", false))
        );
        assert_eq!(
            part_media_type(&part(data, "")),
            Some(("application/json", false))
        );
        assert_eq!(
            part_media_type(&part(Content::Raw(vec![1]), "")),
            Some(("application/octet-stream", false))
        );
        assert_eq!(
            part_media_type(&part(Content::Url("u".into()), "")),
            Some(("application/octet-stream", false))
        );
        assert_eq!(
            part_media_type(&part(Content::Raw(vec![1]), "image/png")),
            Some(("image/png", true))
        );
        assert_eq!(part_media_type(&Part::default()), None);
    }

    #[test]
    fn the_first_refused_part_is_named() {
        let modes = InputModes::of(&card(&["text/plain"], &[]));
        let message = Message {
            parts: vec![
                part(Content::Text("ok".into()), ""),
                Part::default(),
                part(Content::Raw(vec![1]), ""),
                part(Content::Text("x".into()), "text/html"),
            ],
            ..Default::default()
        };
        let Err(A2aError::ContentTypeNotSupported {
            field,
            media_type,
            accepted,
        }) = modes.check(&message)
        else {
            panic!("expected a refusal");
        };
        assert_eq!(field, "message.parts[2]");
        assert_eq!(media_type, "application/octet-stream");
        assert_eq!(accepted, ["text/plain"]);

        let message = Message {
            parts: vec![part(Content::Text("x".into()), "text/html")],
            ..Default::default()
        };
        let Err(A2aError::ContentTypeNotSupported { field, .. }) = modes.check(&message) else {
            panic!("expected a refusal");
        };
        assert_eq!(field, "message.parts[0].media_type");
    }
}
