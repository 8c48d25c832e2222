//! Compiles the vendored, unmodified `proto/a2a.proto` (package `lf.a2a.v1`)
//! with `protox`, a pure-Rust protobuf compiler, so the build needs nothing but
//! cargo (no system `protoc`). One descriptor set drives both the generated
//! prost/tonic code and gRPC server reflection, so there is a single source of
//! truth for the wire schema.
//!
//! The set also holds `google/rpc/error_details.proto` and
//! `google/rpc/status.proto` (vendored unchanged under `proto/google/rpc/`,
//! the copies `tonic-types` ships and encodes its `ErrorInfo` and
//! `BadRequest` with): every A2A error carries those details, and a
//! reflection client such as grpcurl can print them only if reflection
//! describes them.

use std::{env, fs, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);

    // `include_imports` puts the googleapis and well-known-type files in the
    // set too: reflection clients such as grpcurl need every dependency to
    // resolve `lf.a2a.v1` types.
    let mut compiler = protox::Compiler::new(["proto"])?;
    compiler.include_imports(true).open_files([
        "a2a.proto",
        "google/rpc/error_details.proto",
        "google/rpc/status.proto",
    ])?;
    // Encoded by protox itself, so custom options stay in it: the
    // HTTP+JSON binding reads its routes from the `google.api.http`
    // annotations (prost's descriptor types would drop them as unknown
    // fields).
    fs::write(
        out_dir.join("a2a_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;
    let fds = compiler.file_descriptor_set();

    // Type names (`prost::Name`) let the ProtoJSON encoder find each
    // message's descriptor in the same set.
    let mut config = tonic_prost_build::Config::new();
    config.enable_type_names();
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds_with_config(fds, config)?;
    Ok(())
}
