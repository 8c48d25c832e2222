//! Parts of the `a2a-lifecycle` binary that are not the library: the
//! client commands' connection over each binding ([`client`]) and how
//! their failures print ([`call_error`]), its log
//! output and span export ([`logging`]), and `top` ([`top`]).

pub mod call_error;
pub mod client;
pub mod logging;
pub mod top;
