//! `list`: Kubernetes' paged LIST of a prefix, timed. The apiserver reads
//! a large collection in pages of `limit` keys: each page starts just after
//! the last key of the page before, and every page after the first reads
//! at the first page's revision, so the whole list is one consistent view
//! (what its `continue` token carries). One connection, one page at a time,
//! as one apiserver LIST; prints the pages, keys and page latencies.

use std::time::{Duration, Instant};

use crate::grpc::{self, pb::etcdserverpb as pb};
use crate::load::run_on_executor;
use crate::ops::prefix_end;
use crate::report::{new_hist, record};

const RANGE: &str = "/etcdserverpb.KV/Range";

#[derive(clap::Args, Clone, Debug)]
pub struct ListArgs {
    /// host:port of the member to read from (an `http://` prefix is
    /// ignored).
    #[arg(long, default_value = "127.0.0.1:2379")]
    pub endpoint: String,
    /// The listed prefix; "" lists the whole key space.
    #[arg(long, default_value = "")]
    pub prefix: String,
    /// Keys per page (Kubernetes' default chunk size is 500).
    #[arg(long, default_value_t = 500)]
    pub limit: i64,
    /// Keys only, no values (`etcdctl get --keys-only`).
    #[arg(long)]
    pub keys_only: bool,
    /// l (linearizable) or s (serializable) reads.
    #[arg(long, default_value = "l")]
    pub consistency: String,
    /// The most pages read (a bound on the loop, whatever the store holds).
    #[arg(long, default_value_t = 1_000_000)]
    pub max_pages: u64,
}

/// What one paged list read.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Listed {
    pub pages: u64,
    pub keys: u64,
    pub value_bytes: u64,
    /// The revision every page read at.
    pub revision: i64,
    /// Whether the last page said no more keys follow (false: `max_pages`
    /// ended the list first).
    pub complete: bool,
}

pub fn list_cmd(args: ListArgs) -> Result<(), String> {
    let serializable = match args.consistency.as_str() {
        "l" => false,
        "s" => true,
        other => return Err(format!("--consistency: {other:?} is neither l nor s")),
    };
    if args.limit <= 0 {
        return Err("--limit: a paged list needs a limit of at least 1".into());
    }
    if args.max_pages == 0 {
        return Err("--max-pages: at least 1".into());
    }
    let endpoint = args
        .endpoint
        .trim()
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    println!(
        "# list of {:?} on {endpoint}: pages of {} keys{}, {} reads",
        args.prefix,
        args.limit,
        if args.keys_only { ", keys only" } else { "" },
        if serializable {
            "serializable"
        } else {
            "linearizable"
        },
    );
    let (listed, took, hist) = run_on_executor(None, move || async move {
        let mut conn = grpc::Conn::connect(&endpoint).await?;
        let mut hist = new_hist()?;
        let started = Instant::now();
        let listed = list(&mut conn, &args, serializable, |latency| {
            record(&mut hist, latency)
        })
        .await?;
        Ok::<_, String>((listed, started.elapsed(), hist))
    })??;
    let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "list: {} keys ({:.1} MiB of values) in {} pages at revision {}{} in {:.2} s: \
         {:.0} keys/s; page p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        listed.keys,
        listed.value_bytes as f64 / f64::from(1 << 20),
        listed.pages,
        listed.revision,
        if listed.complete {
            ""
        } else {
            " (stopped at --max-pages)"
        },
        took.as_secs_f64(),
        listed.keys as f64 / took.as_secs_f64().max(1e-9),
        ms(0.5),
        ms(0.99),
        hist.max() as f64 / 1000.0,
    );
    Ok(())
}

/// Reads `args.prefix` page by page on `conn`, calling `page_took` with
/// each page's latency.
pub async fn list(
    conn: &mut grpc::Conn,
    args: &ListArgs,
    serializable: bool,
    mut page_took: impl FnMut(Duration),
) -> Result<Listed, String> {
    let range_end = prefix_end(args.prefix.as_bytes());
    // The whole key space is ["\0", "\0") in etcd's terms (as etcdctl
    // sends `get --prefix ""`): an empty key is refused.
    let mut key = if args.prefix.is_empty() {
        vec![0]
    } else {
        args.prefix.as_bytes().to_vec()
    };
    let mut listed = Listed::default();
    while listed.pages < args.max_pages {
        let req = pb::RangeRequest {
            key: key.clone(),
            range_end: range_end.clone(),
            limit: args.limit,
            revision: listed.revision,
            keys_only: args.keys_only,
            serializable,
            ..Default::default()
        };
        let t0 = Instant::now();
        let resp: pb::RangeResponse = conn.unary(RANGE, &req).await?;
        page_took(t0.elapsed());
        if listed.pages == 0 {
            listed.revision = resp.header.as_ref().map_or(0, |h| h.revision);
        }
        listed.pages += 1;
        listed.keys += resp.kvs.len() as u64;
        listed.value_bytes += resp.kvs.iter().map(|kv| kv.value.len() as u64).sum::<u64>();
        let Some(last) = resp.kvs.last() else {
            listed.complete = true;
            break;
        };
        if !resp.more {
            listed.complete = true;
            break;
        }
        // The next page starts just after this one's last key.
        key = last.key.clone();
        key.push(0);
    }
    Ok(listed)
}
