//! `watch`: event latency. `--watchers` watches of a key prefix, spread
//! round-robin over `--streams` Watch bidi streams (themselves spread over
//! the connections), all created before timing; then `--clients` clients
//! put `--total` distinct keys under the prefix at `--put-rate` puts/s.
//! Every put's value starts with its send time (nanoseconds since the run's
//! base instant, little-endian), so each event's latency is its arrival
//! time minus that, with no shared state between putters and watchers.
//!
//! Two series: the event latency (one sample per event per watch; events
//! that had not arrived 5 s after the last put count as errors) and the
//! put latency.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::grpc::{self, pb::etcdserverpb as pb};
use crate::keys::{self, KeyGen};
use crate::load::{self, LoadArgs, Step, Worker};
use crate::ops;
use crate::report::{self, Report};

const WATCH: &str = "/etcdserverpb.Watch/Watch";
/// How long events may trail the last put.
const GRACE: Duration = Duration::from_secs(5);

type WatchStream = grpc::BidiStream<pb::WatchRequest, pb::WatchResponse>;

/// `watch` flags.
#[derive(clap::Args, Clone, Debug)]
pub struct WatchArgs {
    /// `--clients` is the number of putting clients; `--rate` is replaced
    /// by `--put-rate`.
    #[command(flatten)]
    pub load: LoadArgs,
    /// Watches of the prefix, in total.
    #[arg(long, default_value_t = 100)]
    pub watchers: usize,
    /// Watch streams the watches are spread over.
    #[arg(long, default_value_t = 10)]
    pub streams: usize,
    /// Puts per second over all putting clients; 0 = unlimited.
    #[arg(long, default_value_t = 1000)]
    pub put_rate: u64,
    /// Watched prefix; the puts write prefix + a sequential index.
    #[arg(long, default_value = "/watch/")]
    pub prefix: String,
    /// Value size in bytes (at least 8: the send time).
    #[arg(long, default_value_t = 256)]
    pub val_size: usize,
}

/// The send time stamped into a value: nanoseconds since `base`.
pub fn stamp(base: Instant, now: Instant, val_size: usize) -> Vec<u8> {
    let nanos = u64::try_from(now.saturating_duration_since(base).as_nanos()).unwrap_or(u64::MAX);
    let mut v = nanos.to_le_bytes().to_vec();
    v.resize(val_size.max(8), b'v');
    v
}

/// The send time of a stamped value, if it has one.
pub fn sent_at(base: Instant, value: &[u8]) -> Option<Instant> {
    let bytes: [u8; 8] = value.get(..8)?.try_into().ok()?;
    base.checked_add(Duration::from_nanos(u64::from_le_bytes(bytes)))
}

/// A putting client.
struct Putter {
    conn: grpc::Conn,
    keys: KeyGen,
    base: Instant,
    val_size: usize,
}

impl Worker for Putter {
    async fn step(&mut self) -> Step {
        let value = stamp(self.base, Instant::now(), self.val_size);
        Step {
            series: 0,
            result: ops::put(&mut self.conn, self.keys.next_key(), value)
                .await
                .map(|_| None),
        }
    }
}

/// What the stream readers collected.
struct Events {
    hist: Histogram<u64>,
    received: u64,
    last: Option<Instant>,
    first_error: Option<String>,
}

/// Opens a stream and creates `watches` watches of [prefix, end) on it,
/// waiting for each to be confirmed.
async fn open_watches(
    conn: &mut grpc::Conn,
    watches: usize,
    prefix: &[u8],
) -> Result<WatchStream, String> {
    let mut stream: WatchStream = conn.open_stream(WATCH).await?;
    let create = pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
            pb::WatchCreateRequest {
                key: prefix.to_vec(),
                range_end: ops::prefix_end(prefix),
                ..Default::default()
            },
        )),
    };
    for _ in 0..watches {
        stream.send(&create)?;
        let resp = stream.recv().await?;
        if !resp.created || resp.canceled {
            return Err(format!("watch not created: {}", resp.cancel_reason));
        }
    }
    Ok(stream)
}

pub fn watch_cmd(args: WatchArgs) -> Result<(), String> {
    let load = args.load.clone();
    let reports = watch_reports(args)?;
    for r in &reports {
        r.print(load.output)?;
    }
    Ok(())
}

/// The reports of a `watch` run: event latency, then put latency.
pub fn watch_reports(args: WatchArgs) -> Result<Vec<Report>, String> {
    let prefix = args.prefix.clone().into_bytes();
    if prefix.is_empty() {
        return Err("--prefix must not be empty".into());
    }
    let mut load = args.load.clone();
    load.rate = args.put_rate;
    let width = 8.max(keys::digits(load.total.saturating_sub(1)));
    let spec = keys::KeySpec {
        prefix: prefix.clone(),
        width,
        space: u32::try_from(width)
            .ok()
            .and_then(|w| 10u64.checked_pow(w))
            .unwrap_or(u64::MAX),
        sequential: true,
    };
    spec.build()?;
    let watchers = args.watchers.max(1);
    let streams = args.streams.clamp(1, watchers);
    load::run_on_executor(load.cpu, move || async move {
        let keys = spec.build()?;
        let conns = load::connect(&load).await?;
        let events = Rc::new(RefCell::new(Events {
            hist: report::new_hist()?,
            received: 0,
            last: None,
            first_error: None,
        }));
        let base = Instant::now();
        let mut readers = Vec::with_capacity(streams);
        for s in 0..streams {
            let mut conn = conns[s % conns.len()].clone();
            // Watches s, s + streams, .. are on stream s.
            let on_this = (watchers - s).div_ceil(streams);
            let mut stream = open_watches(&mut conn, on_this, &prefix).await?;
            let events = events.clone();
            readers.push(glommio::spawn_local(async move {
                loop {
                    match stream.recv().await {
                        Ok(resp) => {
                            let now = Instant::now();
                            let mut e = events.borrow_mut();
                            for ev in &resp.events {
                                let Some(kv) = ev.kv.as_ref() else { continue };
                                if let Some(at) = sent_at(base, &kv.value) {
                                    report::record(&mut e.hist, now.saturating_duration_since(at));
                                    e.received += 1;
                                    e.last = Some(now);
                                }
                            }
                        }
                        Err(err) => {
                            events.borrow_mut().first_error.get_or_insert(err);
                            return;
                        }
                    }
                }
            }));
        }
        let putters = (0..load.clients())
            .map(|c| Putter {
                conn: conns[c % conns.len()].clone(),
                keys: keys.for_client(c),
                base,
                val_size: args.val_size,
            })
            .collect();
        let start = Instant::now();
        let put_name = format!("{} put-rate={}", load.label("watch put"), args.put_rate);
        let mut puts = load::run(&load, &[put_name], putters, None).await?;
        let expected = puts.first().map_or(0, |r| r.ops) * watchers as u64;
        let grace = Instant::now() + GRACE;
        while events.borrow().received < expected
            && events.borrow().first_error.is_none()
            && Instant::now() < grace
        {
            glommio::timer::sleep(Duration::from_millis(10)).await;
        }
        // Dropping the readers cancels them and ends their streams.
        drop(readers);
        let e = events.borrow();
        if let Some(err) = &e.first_error {
            eprintln!("metcd-bench: watch stream: {err}");
        }
        let received = e.received.min(expected);
        let elapsed = e.last.unwrap_or(start).saturating_duration_since(start);
        let event_report = Report::new(
            format!("watch events watchers={watchers} streams={streams}"),
            expected,
            received,
            expected - received,
            elapsed,
            e.hist.clone(),
        );
        let mut reports = vec![event_report];
        reports.append(&mut puts);
        Ok(reports)
    })?
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn stamped_values_give_back_their_send_time() {
        let base = Instant::now();
        let now = base + Duration::from_micros(1234);
        let v = stamp(base, now, 256);
        assert_eq!(v.len(), 256);
        assert_eq!(sent_at(base, &v), Some(now));
        assert_eq!(stamp(base, now, 0).len(), 8);
        assert_eq!(sent_at(base, b"short"), None);
    }
}
