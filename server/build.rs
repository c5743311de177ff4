//! Generates etcd's v3 wire API (packages `etcdserverpb`, `mvccpb`,
//! `authpb`, `v3lockpb`, `v3electionpb`) from `proto/` into `OUT_DIR`: prost message types plus tonic
//! server and client stubs. `src/api/grpc/pb.rs` includes the result.
//!
//! `protoc` comes from the `protoc-bin-vendored` crate, so no system
//! protobuf compiler is needed (and an installed one is ignored).
//! Transport code is not generated (`build_transport(false)`): the server
//! runs the generated services on its own hyper/glommio stack, and the
//! generated clients work over any `tonic::client::GrpcService`.

use std::error::Error;

const PROTO_ROOT: &str = "proto";
const PROTOS: &[&str] = &[
    "proto/etcd/api/mvccpb/kv.proto",
    "proto/etcd/api/authpb/auth.proto",
    "proto/etcd/api/etcdserverpb/rpc.proto",
    "proto/etcd/api/v3lockpb/v3lock.proto",
    "proto/etcd/api/v3electionpb/v3election.proto",
];

fn main() -> Result<(), Box<dyn Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // prost-build runs whatever `PROTOC` names. (`set_var` is a safe fn in
    // edition 2021; this build script has no other threads.)
    std::env::set_var("PROTOC", &protoc);

    println!("cargo:rerun-if-changed={PROTO_ROOT}");
    let descriptors =
        std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("etcd_descriptors.bin");
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .build_transport(false)
        // `bytes` fields as `bytes::Bytes`: keys and values are slices of
        // the request buffer instead of copies.
        .bytes(".")
        .emit_rerun_if_changed(true)
        .file_descriptor_set_path(&descriptors)
        .compile_protos(PROTOS, &[PROTO_ROOT])?;
    // serde (proto3 JSON as etcd's gRPC gateway writes it: original field
    // names, 64-bit integers as strings, bytes as base64, defaults left
    // out) for the `/v3/...` JSON routes.
    pbjson_build::Builder::new()
        .register_descriptors(&std::fs::read(&descriptors)?)?
        .preserve_proto_field_names()
        // etcd's gateway ignores fields it does not know.
        .ignore_unknown_fields()
        .build(&[
            ".mvccpb",
            ".authpb",
            ".etcdserverpb",
            ".v3lockpb",
            ".v3electionpb",
        ])?;
    Ok(())
}
