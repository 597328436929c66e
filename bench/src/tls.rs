//! The HTTPS rows: an ECDSA P-256 certificate made for the run (`openssl
//! req`), served by Flashgate's `[gateway.tls]` listener and by nginx
//! (`bench/conf/nginx-tls.conf.in`), both driven by h2load (Debian's
//! `nghttp2-client`, TLS 1.3 and HTTP/2 by ALPN).
//!
//! - The page: `TLS_PAGE_CONNS` connections × `TLS_PAGE_STREAMS`
//!   concurrent streams each, for the round's seconds after a warmup.
//! - Full handshakes: every connection new and sending one request, in
//!   batches of `HANDSHAKE_BATCH` connections (one h2load each, all
//!   connecting at once) until the round's seconds are over. h2load keeps
//!   no session between connections, so every handshake is a full one.
//!
//! h2load reports no percentiles: a round's `p50_ms` holds its mean
//! request time and `p99_ms`/`p999_ms`/`max_ms` its longest.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};

use crate::load::Summary;

/// Connections of the page row.
pub const TLS_PAGE_CONNS: usize = 64;
/// Concurrent HTTP/2 streams per connection in the page row.
pub const TLS_PAGE_STREAMS: usize = 10;
/// New connections per h2load in the handshake row.
pub const HANDSHAKE_BATCH: usize = 256;

/// The run's certificate and key (PEM files).
#[derive(Debug, Clone)]
pub struct Cert {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Makes a self-signed ECDSA P-256 certificate for `localhost` and
/// 127.0.0.1 in `dir`.
///
/// # Errors
/// When `openssl` is missing or fails.
pub fn make_cert(dir: &Path) -> anyhow::Result<Cert> {
    let cert = dir.join("tls-cert.pem");
    let key = dir.join("tls-key.pem");
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout",
        ])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .context("run openssl")?;
    ensure!(
        out.status.success(),
        "openssl req: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(Cert { cert, key })
}

/// Whether h2load can be run.
pub fn h2load_available() -> bool {
    Command::new("h2load")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// What one h2load run printed, parsed.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct H2load {
    pub elapsed_s: f64,
    pub succeeded: u64,
    /// Failed, errored and timed out requests.
    pub failed: u64,
    /// `2xx`, `3xx`, `4xx`, `5xx` counts, keyed 200, 300, 400, 500.
    pub statuses: Vec<(u16, u64)>,
    pub mean_ms: f64,
    pub max_ms: f64,
    /// `TLS Protocol:` and `Application protocol:`.
    pub protocol: String,
    pub alpn: String,
}

fn duration_ms(v: &str) -> Option<f64> {
    let v = v.trim();
    let (num, scale) = if let Some(n) = v.strip_suffix("us") {
        (n, 1e-3)
    } else if let Some(n) = v.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1e3)
    } else {
        return None;
    };
    num.trim().parse::<f64>().ok().map(|x| x * scale)
}

/// Parses h2load's report.
pub fn parse(out: &str) -> H2load {
    let mut r = H2load::default();
    for line in out.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("finished in ") {
            r.elapsed_s = rest
                .split(',')
                .next()
                .and_then(duration_ms)
                .map_or(0.0, |ms| ms / 1e3);
        } else if let Some(rest) = line.strip_prefix("requests:") {
            let count = |name: &str| -> u64 {
                rest.split(',')
                    .find_map(|kv| {
                        let kv = kv.trim();
                        kv.strip_suffix(name)?.trim().parse().ok()
                    })
                    .unwrap_or(0)
            };
            r.succeeded = count("succeeded");
            r.failed = count("failed") + count("errored") + count("timeout");
        } else if let Some(rest) = line.strip_prefix("status codes:") {
            for (kv, code) in rest.split(',').zip([200_u16, 300, 400, 500]) {
                let n = kv
                    .split_whitespace()
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
                if n > 0 {
                    r.statuses.push((code, n));
                }
            }
        } else if let Some(rest) = line.strip_prefix("time for request:") {
            // min max mean sd +/- sd
            let f: Vec<&str> = rest.split_whitespace().collect();
            r.max_ms = f.get(1).and_then(|v| duration_ms(v)).unwrap_or(0.0);
            r.mean_ms = f.get(2).and_then(|v| duration_ms(v)).unwrap_or(0.0);
        } else if let Some(rest) = line.strip_prefix("TLS Protocol:") {
            rest.trim().clone_into(&mut r.protocol);
        } else if let Some(rest) = line.strip_prefix("Application protocol:") {
            rest.trim().clone_into(&mut r.alpn);
        }
    }
    r
}

fn h2load(args: &[String], url: &str) -> anyhow::Result<H2load> {
    let out = Command::new("h2load")
        .args(args)
        .arg(url)
        .output()
        .context("run h2load (Debian package nghttp2-client)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "h2load {}: {}{}",
        args.join(" "),
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(parse(&text))
}

/// Which HTTPS row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The page over kept connections with concurrent streams.
    Page,
    /// One new connection (a full handshake) per request.
    Handshake,
}

/// Runs one HTTPS round against `addr` (`https://127.0.0.1:port{path}`):
/// probes before and after the measured window, the summary of it.
///
/// # Errors
/// When h2load fails, or a request fails, or TLS 1.3 + HTTP/2 was not
/// what was negotiated.
pub async fn round<S: Send + 'static>(
    addr: SocketAddr,
    path: &str,
    mode: Mode,
    warmup: Duration,
    secs: Duration,
    probe: impl Fn() -> S + Send + Sync + 'static,
) -> anyhow::Result<(Summary, S, S)> {
    let url = format!("https://{addr}{path}");
    tokio::task::spawn_blocking(move || run_blocking(&url, mode, warmup, secs, probe)).await?
}

fn run_blocking<S>(
    url: &str,
    mode: Mode,
    warmup: Duration,
    secs: Duration,
    probe: impl Fn() -> S,
) -> anyhow::Result<(Summary, S, S)> {
    let mut runs = Vec::new();
    let (a, b) = match mode {
        Mode::Page => {
            let args: Vec<String> = vec![
                "-t".into(),
                "2".into(),
                "-c".into(),
                TLS_PAGE_CONNS.to_string(),
                "-m".into(),
                TLS_PAGE_STREAMS.to_string(),
                // Whole milliseconds: h2load reads no fractions.
                "-D".into(),
                format!("{}ms", secs.as_millis().max(1)),
                format!("--warm-up-time={}ms", warmup.as_millis()),
            ];
            // h2load measures after its warmup; the probes bracket the
            // same window (warmup and connecting outside it).
            let started = Instant::now();
            let handle = std::thread::scope(|scope| {
                let h = scope.spawn(|| h2load(&args, url));
                std::thread::sleep(warmup + Duration::from_millis(50));
                let a = probe();
                let left = (warmup + secs).saturating_sub(started.elapsed());
                std::thread::sleep(left.saturating_sub(Duration::from_millis(50)));
                let b = probe();
                (h.join(), a, b)
            });
            let (joined, a, b) = handle;
            runs.push(joined.map_err(|_| anyhow::anyhow!("h2load thread panicked"))??);
            (a, b)
        }
        Mode::Handshake => {
            let n = HANDSHAKE_BATCH.to_string();
            let args: Vec<String> = vec![
                "-t".into(),
                "2".into(),
                "-c".into(),
                n.clone(),
                "-n".into(),
                n,
            ];
            let warm_until = Instant::now() + warmup;
            while Instant::now() < warm_until {
                h2load(&args, url)?;
            }
            let a = probe();
            let t = Instant::now();
            while t.elapsed() < secs {
                runs.push(h2load(&args, url)?);
            }
            let b = probe();
            // The window is the batches' wall time, h2load's start-up
            // included: the server waits through it on both sides alike.
            let wall = t.elapsed().as_secs_f64();
            if let Some(first) = runs.first_mut() {
                first.elapsed_s = wall;
            }
            runs.iter_mut().skip(1).for_each(|r| r.elapsed_s = 0.0);
            (a, b)
        }
    };
    let first = runs.first().cloned().unwrap_or_default();
    ensure!(
        first.protocol == "TLSv1.3" && first.alpn == "h2",
        "{url}: negotiated {:?} / {:?}, not TLSv1.3 / h2",
        first.protocol,
        first.alpn
    );
    let mut s = Summary::default();
    let mut mean_weighted = 0.0;
    for r in &runs {
        s.requests += r.succeeded;
        s.elapsed_s += r.elapsed_s;
        s.errors += r.failed;
        for (code, n) in &r.statuses {
            *s.statuses.entry(*code).or_default() += n;
            *s.total_statuses.entry(*code).or_default() += n;
        }
        mean_weighted += r.mean_ms * r.succeeded as f64;
        s.max_ms = s.max_ms.max(r.max_ms);
    }
    ensure!(s.errors == 0, "{url}: {} requests failed", s.errors);
    s.rps = s.requests as f64 / s.elapsed_s.max(1e-9);
    s.p50_ms = mean_weighted / (s.requests.max(1) as f64);
    s.p90_ms = s.p50_ms;
    s.p99_ms = s.max_ms;
    s.p999_ms = s.max_ms;
    Ok((s, a, b))
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUT: &str = "starting benchmark...
TLS Protocol: TLSv1.3
Cipher: TLS_AES_128_GCM_SHA256
Server Temp Key: X25519 253 bits
Application protocol: h2

finished in 2.50s, 40000.00 req/s, 270.12MB/s
requests: 100000 total, 100000 started, 100000 done, 99998 succeeded, 2 failed, 0 errored, 0 timeout
status codes: 99998 2xx, 0 3xx, 0 4xx, 0 5xx
traffic: 675.29MB (708091460) total, 1.20MB (1258510) headers (space savings 95.18%), 671.08MB (703680000) data
                     min         max         mean         sd        +/- sd
time for request:      215us     45.12ms     15.76ms      3.21ms    81.23%
time for connect:     1.02ms     10.34ms      5.21ms      2.93ms    57.81%
";

    #[test]
    fn h2load_reports_are_read_with_their_units() {
        let r = parse(OUT);
        assert_eq!(r.elapsed_s, 2.5);
        assert_eq!(r.succeeded, 99_998);
        assert_eq!(r.failed, 2);
        assert_eq!(r.statuses, vec![(200, 99_998)]);
        assert!((r.max_ms - 45.12).abs() < 1e-9);
        assert!((r.mean_ms - 15.76).abs() < 1e-9);
        assert_eq!(r.protocol, "TLSv1.3");
        assert_eq!(r.alpn, "h2");
    }

    #[test]
    fn durations_in_microseconds_and_seconds_become_milliseconds() {
        assert_eq!(duration_ms("215us"), Some(0.215));
        assert_eq!(duration_ms("1.5s"), Some(1500.0));
        assert_eq!(duration_ms("12"), None);
    }
}
