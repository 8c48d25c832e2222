//! The `--extended-card` file completed for GetExtendedAgentCard (spec
//! §3.1.11): given the fields the server fills in on the public card, and
//! refused at start when it contradicts them.

use super::CardError;
use crate::proto::{AgentCapabilities, AgentCard};

/// The `--extended-card` file with the fields the server fills in on the
/// public card (`public`): the interfaces, `streaming` as the agent
/// declares it, `pushNotifications` false and `extendedAgentCard` true.
/// Spec §3.1.11: a client replaces its cached public card with this one,
/// so a field left out would read as "off" (a client would stop
/// streaming); one that contradicts the public card is refused.
pub(super) fn complete(
    mut extended: AgentCard,
    public: &AgentCard,
) -> Result<AgentCard, CardError> {
    let contradiction = |field, problem: String| CardError::ExtendedCard { field, problem };
    if extended.supported_interfaces.is_empty() {
        extended.supported_interfaces = public.supported_interfaces.clone();
    } else if extended.supported_interfaces != public.supported_interfaces {
        let ours: Vec<String> = public
            .supported_interfaces
            .iter()
            .map(|i| {
                format!(
                    "{} {} version {}",
                    i.protocol_binding, i.url, i.protocol_version
                )
            })
            .collect();
        return Err(contradiction(
            "supportedInterfaces",
            format!(
                "differs from the public card's [{}]: leave it out and the server fills it in",
                ours.join(", ")
            ),
        ));
    }
    let public_capabilities = public.capabilities.clone().unwrap_or_default();
    let capabilities = extended
        .capabilities
        .get_or_insert_with(AgentCapabilities::default);
    let streams = public_capabilities.streaming == Some(true);
    match capabilities.streaming {
        None => capabilities.streaming = public_capabilities.streaming,
        Some(declared) if declared == streams => {}
        Some(declared) => {
            let agent = if streams {
                "streams"
            } else {
                "does not stream"
            };
            return Err(contradiction(
                "capabilities.streaming",
                format!(
                    "is {declared}, but the agent {agent}: leave it out or set it to {streams}"
                ),
            ));
        }
    }
    super::declare_server_extensions(capabilities);
    let push = public
        .capabilities
        .as_ref()
        .and_then(|c| c.push_notifications)
        .unwrap_or(false);
    let fixed = [
        (
            &mut capabilities.push_notifications,
            push,
            "capabilities.pushNotifications",
            if push {
                "this server delivers push notifications"
            } else {
                "this server offers no push notifications"
            },
        ),
        (
            &mut capabilities.extended_agent_card,
            true,
            "capabilities.extendedAgentCard",
            "this is the extended card",
        ),
    ];
    for (value, expected, field, why) in fixed {
        match *value {
            None => *value = Some(expected),
            Some(declared) if declared == expected => {}
            Some(declared) => {
                return Err(contradiction(
                    field,
                    format!("is {declared}, but {why}: leave it out or set it to {expected}"),
                ));
            }
        }
    }
    Ok(extended)
}
