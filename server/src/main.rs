//! `metcd`: starts one member with the given flags / config file;
//! `metcd snapshot restore|status ...` restores or inspects a backup.

use server::config::Config;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    // Purging stays on until the member serves (release_freed_memory).
    server::alloc::tune_for_startup();
    let mut args = std::env::args_os().skip(1);
    if args.next().is_some_and(|a| a == "snapshot") {
        std::process::exit(server::backup::cli(args.collect()));
    }
    let flags = server::flag_docs::parse();
    if flags.version {
        print!("{}", server::version_text());
        return;
    }
    let cfg = match Config::from_flags(flags) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("metcd: {e}");
            std::process::exit(2);
        }
    };
    eprintln!(
        "metcd {}: member {:?}, data dir {}, engine {}",
        env!("CARGO_PKG_VERSION"),
        cfg.name,
        cfg.data_dir().display(),
        cfg.engine
    );
    match server::backup::adopt_etcd_restore(&cfg) {
        Ok(Some(r)) => eprintln!(
            "metcd: {} held what `etcdctl snapshot restore` writes: built this member from its \
             db (revision {}, raft index {}, {} member(s)); etcd's files are kept in \
             member.etcd",
            r.data_dir.display(),
            r.revision,
            r.index,
            r.members
        ),
        Ok(None) => {}
        Err(e) => {
            eprintln!("metcd: {e}");
            std::process::exit(1);
        }
    }
    // Test-only disk faults (the fault suite's): `FAILPOINTS=wal::fdatasync=
    // 200*off->return` fails the 201st WAL fsync. Unset, nothing is armed.
    let _failpoints = std::env::var_os("FAILPOINTS").map(|_| {
        eprintln!("metcd: FAILPOINTS is set: injecting the faults it names (tests only)");
        fail::FailScenario::setup()
    });
    if let Err(e) = server::stop::install() {
        eprintln!("metcd: cannot install signal handlers: {e}");
        std::process::exit(1);
    }
    if let Err(e) = server::shard::run(cfg) {
        eprintln!("metcd: {e}");
        std::process::exit(1);
    }
}
