//! RPCs for capabilities this agent does not declare (spec §3.3.4): push
//! notification configs answer PushNotificationNotSupportedError and
//! GetExtendedAgentCard answers UnsupportedOperationError.

use tonic::Status;

use crate::error::A2aError;

pub fn push_not_supported() -> Status {
    A2aError::PushNotificationNotSupported.into()
}

pub fn extended_card_not_supported() -> Status {
    A2aError::unsupported(
        "this agent does not declare capabilities.extendedAgentCard",
        None,
    )
    .into()
}
