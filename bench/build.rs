//! Generates the etcd v3 message types (no services) from the project's
//! own protos in `server/proto`: the bench is a client and speaks the wire
//! API, it never links the server. protoc is vendored.

use std::error::Error;

const PROTO_ROOT: &str = "../server/proto";
const PROTOS: &[&str] = &[
    "../server/proto/etcd/api/mvccpb/kv.proto",
    "../server/proto/etcd/api/authpb/auth.proto",
    "../server/proto/etcd/api/etcdserverpb/rpc.proto",
];

fn main() -> Result<(), Box<dyn Error>> {
    std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    println!("cargo:rerun-if-changed={PROTO_ROOT}");
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(false)
        .build_transport(false)
        .compile_protos(PROTOS, &[PROTO_ROOT])?;
    Ok(())
}
