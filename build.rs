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
    // `a2a_v0_3.proto` is the protocol's previous version (package
    // `a2a.v1`), unchanged from a2aproject/A2A at a8b45dcc, the revision
    // the official 0.3 SDKs were generated from; it has its own file name
    // because one descriptor pool cannot hold two `a2a.proto`. Its types
    // serve 0.3 clients at the edge (`src/service/v0_3`).
    compiler.include_imports(true).open_files([
        "a2a.proto",
        "a2a_v0_3.proto",
        "google/rpc/error_details.proto",
        "google/rpc/status.proto",
    ])?;
    // Encoded by protox itself, so custom options stay in it: the
    // HTTP+JSON binding reads its routes from the `google.api.http`
    // annotations (prost's descriptor types would drop them as unknown
    // fields).
    let encoded = compiler.encode_file_descriptor_set();
    fs::write(out_dir.join("a2a_descriptor.bin"), &encoded)?;
    let fds = compiler.file_descriptor_set();

    // The well-known types are the project's own (`src/wkt.rs`): the same
    // wire form as prost-types', with the serde (ProtoJSON) impls the
    // generated codec below needs. `Empty` stays `()`.
    const WELL_KNOWN: [(&str, &str); 5] = [
        (".google.protobuf.Timestamp", "crate::wkt::Timestamp"),
        (".google.protobuf.Struct", "crate::wkt::Struct"),
        (".google.protobuf.Value", "crate::wkt::Value"),
        (".google.protobuf.ListValue", "crate::wkt::ListValue"),
        (".google.protobuf.NullValue", "crate::wkt::NullValue"),
    ];

    // Type names (`prost::Name`) let the ProtoJSON code find each
    // message's descriptor in the same set (HTTP+JSON routes, card
    // canonicalization).
    let mut config = tonic_prost_build::Config::new();
    config.enable_type_names();
    for (proto, rust) in WELL_KNOWN {
        config.extern_path(proto, rust);
    }
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds_with_config(fds, config)?;

    // ProtoJSON (spec §5.5) as generated serde impls: camelCase names
    // (the original names accepted too), enum names, 64-bit integers as
    // strings, bytes as base64, unknown fields refused.
    let mut json = pbjson_build::Builder::new();
    json.register_descriptors(&encoded)?.out_dir(&out_dir);
    for (proto, rust) in WELL_KNOWN {
        json.extern_path(proto, rust);
    }
    json.build(&[".lf.a2a.v1", ".a2a.v1"])?;
    Ok(())
}
