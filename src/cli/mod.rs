//! Parts of the `a2a-lifecycle` binary that are not the library: its log
//! output and span export ([`logging`]), and `top` ([`top`]).

pub mod logging;
pub mod top;
