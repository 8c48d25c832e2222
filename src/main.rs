//! The `a2a-lifecycle` command's entry point: parses the command line,
//! starts the log output and runs the subcommand (`serve` the server with
//! the demo agents, the others a small client for it, printing ProtoJSON,
//! streams as one JSON object per line; [`cli`]).

use clap::Parser;

mod cli;

use cli::args::{Cli, Command};

/// mimalloc: a request allocates many small objects (strings and vectors of
/// the proto types), and glibc's malloc spent about a fifth of the
/// server's CPU on them (perf). The bare comparison server uses the same
/// allocator, so benchmark ratios compare code, not allocators.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Errors end the process with their message, as written (not Rust's
/// quoted debug form), and exit status 1.
fn main() -> std::process::ExitCode {
    let result = a2a_lifecycle::server::runtime()
        .map_err(|e| Box::new(e) as Box<dyn std::error::Error>)
        .and_then(|runtime| runtime.block_on(run()));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // `a2a-lifecycle ... | head`: the reader has what it wanted.
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    // Flushes the spans not yet exported when the command ends.
    let _logging = cli::logging::init(cli.log_format, cli.otlp_endpoint.as_deref())?;
    match cli.command {
        Command::Serve(args) => cli::serve::run(args).await,
        Command::Client(command) => cli::client_commands::run(command).await,
    }
}
