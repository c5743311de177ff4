//! `metcd`: starts one member with the given flags / config file.

use clap::Parser;
use server::config::{Config, Flags};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    server::alloc::tune();
    let flags = Flags::parse();
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
    if let Err(e) = server::shard::run(cfg) {
        eprintln!("metcd: {e}");
        std::process::exit(1);
    }
}
