//! Stopping on SIGTERM and SIGINT as etcd stops: the request is noted
//! here, the Raft loop sees it on its next turn (at most one heartbeat
//! interval later), a leader hands its leadership to the most caught-up
//! voter first, and the process exits with status 0.
//!
//! Nothing acknowledged can be lost by stopping at any point: a write is
//! answered only once its WAL frame is durable (the same reason kill -9 is
//! safe). The handlers are our own, installed whatever the parent left
//! (a shell that started metcd in the background with SIGINT ignored).
//!
//! This module is the one place besides fatal errors that ends the
//! process; a second signal, or a stop that overruns [`STOP_LIMIT`], ends
//! it at once with status 1.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The longest a requested stop may take before the process is ended
/// anyway (a leadership transfer that does not finish, a stuck disk).
pub const STOP_LIMIT: Duration = Duration::from_secs(10);

static REQUESTED: AtomicBool = AtomicBool::new(false);

/// Whether SIGTERM or SIGINT asked this process to stop.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::Relaxed)
}

/// Installs handlers for SIGTERM and SIGINT and a thread that turns the
/// first into a stop request (and the second into an immediate exit).
pub fn install() -> std::io::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])?;
    std::thread::Builder::new()
        .name("metcd-signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                let name = if signal == SIGINT {
                    "interrupt"
                } else {
                    "terminated"
                };
                if REQUESTED.swap(true, Ordering::Relaxed) {
                    eprintln!("metcd: received {name} signal again; exiting now");
                    exit(1);
                }
                eprintln!("metcd: received {name} signal, shutting down...");
                std::thread::spawn(|| {
                    std::thread::sleep(STOP_LIMIT);
                    eprintln!("metcd: stop took longer than {STOP_LIMIT:?}; exiting now");
                    exit(1);
                });
            }
        })?;
    Ok(())
}

/// Ends the process: the requested stop is done (status 0), or it failed.
pub fn exit(code: i32) -> ! {
    std::process::exit(code)
}
