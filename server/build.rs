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

/// `metcd --version`'s git SHA and Rust version, as etcd's `--version`
/// prints its Git SHA and Go version.
fn version_info() {
    let run = |program: &str, args: &[&str]| {
        std::process::Command::new(program)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    let sha = run("git", &["rev-parse", "--short=12", "HEAD"])
        .unwrap_or_else(|| "Not provided (not built from a git checkout)".into());
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let rust = run(&rustc, &["--version"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=METCD_GIT_SHA={sha}");
    println!("cargo:rustc-env=METCD_RUSTC_VERSION={rust}");
    // A new commit changes HEAD's ref (or HEAD itself when detached).
    if let Some(git_dir) = run("git", &["rev-parse", "--git-dir"]) {
        let git_dir = std::path::Path::new(&git_dir);
        println!("cargo:rerun-if-changed={}", git_dir.join("HEAD").display());
        if let Some(head_ref) = run("git", &["symbolic-ref", "-q", "HEAD"]) {
            // A ref packed away has no file of its own (and a missing file
            // would rerun this script on every build).
            let loose = git_dir.join(head_ref);
            let watched = if loose.exists() {
                loose
            } else {
                git_dir.join("packed-refs")
            };
            println!("cargo:rerun-if-changed={}", watched.display());
        }
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    version_info();
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
