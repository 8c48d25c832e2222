//! How the client commands print: ProtoJSON on stdout, a response
//! indented, a stream event on one line.

/// A response as indented ProtoJSON (spec §5.5).
pub fn print_pretty<M: serde::Serialize>(message: &M) -> Result<(), Box<dyn std::error::Error>> {
    write_out(&a2a_lifecycle::json::to_string_pretty(message)?)
}

/// A stream event as one line of ProtoJSON (JSON Lines, for `jq` and
/// scripts).
pub fn print_line<M: serde::Serialize>(message: &M) -> Result<(), Box<dyn std::error::Error>> {
    write_out(&a2a_lifecycle::json::to_string(message)?)
}

/// One line on stdout. A reader that went away (`| head`) is an
/// `io::Error` of kind `BrokenPipe`, which `main` ends on quietly (where
/// `println!` panics).
fn write_out(line: &str) -> Result<(), Box<dyn std::error::Error>> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}
