//! Parts of the `a2a-lifecycle` binary that are not the library: the
//! client commands' connection over each binding ([`client`]), its log
//! output and span export ([`logging`]), and `top` ([`top`]).

pub mod client;
pub mod logging;
pub mod top;
