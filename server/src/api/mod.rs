//! Client-facing APIs. `error` is the one place errors meet the wire.

pub mod error;
pub mod grpc;
pub mod http;
pub mod hyper_io;

use std::future::Future;

/// Accepts connections forever, one task per connection (`serve_one`).
/// A failed accept (e.g. out of file descriptors) is logged and retried
/// after a pause, never fatal.
pub async fn accept_loop<F, Fut>(listener: crate::net::Listener, api: &'static str, serve_one: F)
where
    F: Fn(crate::net::Accepted) -> Fut,
    Fut: Future<Output = ()> + 'static,
{
    loop {
        match listener.accept().await {
            Ok(stream) => {
                glommio::spawn_local(serve_one(stream)).detach();
            }
            Err(e) => {
                eprintln!("metcd: {api} accept failed: {e}");
                glommio::timer::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    }
}
