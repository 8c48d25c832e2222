//! Generated protobuf types, tonic server and client for `lf.a2a.v1`
//! (the official `a2a.proto`, compiled by `build.rs`).

#![allow(clippy::all, missing_docs)]

tonic::include_proto!("lf.a2a.v1");
include!(concat!(env!("OUT_DIR"), "/lf.a2a.v1.serde.rs"));

/// The protocol's previous version, 0.3 (package `a2a.v1`,
/// `proto/a2a_v0_3.proto`): the types its gRPC service and HTTP+JSON
/// routes speak. The server translates them to and from the 1.0 types at
/// the edge (the bindings' 0.3 module); nothing past the bindings sees
/// them.
pub mod v0_3 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("a2a.v1");
    include!(concat!(env!("OUT_DIR"), "/a2a.v1.serde.rs"));
}

/// The encoded `FileDescriptorSet` of `a2a.proto` and everything it imports,
/// served by gRPC reflection (v1 and v1alpha).
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/a2a_descriptor.bin"));

/// Largest encoded gRPC message accepted or sent (tonic's default, named):
/// a property of the wire, which the service, the runtime (the largest
/// task) and the server all size themselves by.
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
