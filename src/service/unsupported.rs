//! RPCs for capabilities this server does not offer (spec §3.3.4): the push
//! notification config RPCs answer PushNotificationNotSupportedError (the
//! cards declare `capabilities.pushNotifications` false).

use tonic::Status;

use crate::error::A2aError;

pub fn push_not_supported() -> Status {
    A2aError::PushNotificationNotSupported.into()
}
