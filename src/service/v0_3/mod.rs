//! Protocol 0.3 at the edge: what 0.3 clients send and read, translated
//! to and from the 1.0 requests, responses, events and errors the one
//! core serves (`A2aApi`). Nothing past the bindings sees a 0.3 shape.
//!
//! Owns:
//! - the 0.3 JSON-RPC payloads (`types`: A2A 0.3 `types.ts`, `kind`
//!   discriminators, kebab-case states, lowercase roles, `final`);
//! - their translation (`convert`): a 0.3 request becomes the 1.0
//!   request, a 1.0 answer or event goes back in 0.3 form, a 1.0 error
//!   takes its 0.3 code;
//! - the 0.3 JSON-RPC methods (`jsonrpc`), served on the same endpoint
//!   as the 1.0 ones and told apart by name (`message/send` against
//!   `SendMessage`): the two sets cannot overlap;
//! - the 0.3 HTTP+JSON routes (`rest`, under `/v1/`, bodies the ProtoJSON
//!   of 0.3's proto, translated by `pb`);
//! - the 0.3 gRPC service (`grpc`, `a2a.v1.A2AService`, on 0.3's proto).

pub mod convert;
pub mod grpc;
pub mod jsonrpc;
pub mod pb;
pub mod rest;
pub mod types;
