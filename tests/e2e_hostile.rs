//! Hostile clients against the real binary over real TLS (RELIABILITY.md, "Hostile clients"):
//! rapid reset (CVE-2023-44487), a CONTINUATION flood, connections that go silent (after the
//! TCP connect, after the TLS handshake, after the HTTP/2 preface), zero-window readers of a
//! large list, and thousands of idle connections beyond the per-address bound. The attacks
//! come from loopback addresses of their own (127.0.0.2 and up), as other pods would, with
//! a raw HTTP/2 client (the `h2` crate) or frames written by hand.
//!
//! Each test measures a well-behaved client (a keep-alive HTTPS client reading the list of
//! all pods, cached) first, then again during the attack, and asserts a bound on the median
//! during it: a ratio of the median before plus a few milliseconds (a sub-millisecond
//! baseline doubles with one descheduling on a 2-core machine another suite shares, while a
//! starved server's median grows by tens of milliseconds); it reads percolator's resident memory, descriptors and threads from `/proc` and its
//! tasks from `/metrics`, before, during and after, and asserts the bounds the serving loop
//! documents. percolator runs with short bounds (idle 4 s, PING after 1 s, write 3 s, request
//! 5 s, 300 connections per address, 1,000 in all) so that each one acts within the test; the
//! mechanisms are the flags', whatever their values. The tests start their percolator in
//! parallel but attack one at a time ([`ATTACKS`]), and pace their attackers: they share the
//! machine's two cores with the server, and a machine saturated by the test itself would
//! measure nothing.
//!
//! The figures are printed (`cargo test --test e2e_hostile -- --nocapture`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use common::{Env, Options, TESTER_TOKEN, procfs};
use rustls::pki_types::pem::PemObject;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// The list every client reads: all pods, a few hundred kilobytes (more than one body frame,
/// so that it takes one of its connection's body slots).
const LIST: &str = "/apis/stats.une-tasse-de.cafe/v1alpha1/podmetricssummaries";
/// percolator's bounds in these tests: `--connection-idle-timeout` (but in the idle
/// connections test), `--http2-read-idle-timeout`, `--http2-ping-timeout`, `--write-timeout`,
/// `--request-timeout`, `--max-connections-per-ip`, `--max-connections`.
const IDLE: Duration = Duration::from_secs(4);
const READ_IDLE: Duration = Duration::from_secs(1);
const PING_TIMEOUT: Duration = Duration::from_secs(1);
const WRITE_TIMEOUT: Duration = Duration::from_secs(3);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// `HANDSHAKE_TIMEOUT` of the serving loop (no flag).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const PER_IP: usize = 300;
const TOTAL: usize = 1000;
/// Slack for a deadline seen from outside: scheduling on a loaded 2-core machine.
const SLACK: Duration = Duration::from_millis(2500);
/// Requests of the well-behaved client per measurement.
const PROBES: usize = 40;
/// How much slower the well-behaved client's median may be during an attack than before it:
/// `LATENCY_RATIO` times, plus `LATENCY_ALLOWANCE` (scheduling of a machine the attacker, the
/// server and another suite share; the median of a starved server grows far beyond it).
const LATENCY_RATIO: f64 = 5.0;
const LATENCY_ALLOWANCE: Duration = Duration::from_millis(10);

/// One attack at a time in this binary: each test starts its percolator in parallel with the
/// others, but measures its well-behaved client only while no other attack runs on the
/// machine's two cores.
static ATTACKS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What percolator holds, read from `/proc/<pid>` and `/metrics`.
#[derive(Debug, Clone, Copy)]
struct Vitals {
    rss_kib: u64,
    fds: u64,
    threads: u64,
    tasks: u64,
}

/// percolator started for one attack, with the client side's TLS settings.
struct Target {
    env: Env,
    pid: u32,
    addr: SocketAddr,
    roots: Arc<rustls::RootCertStore>,
}

/// Starts percolator (200 pods: the list is a few hundred kilobytes) with the tests' bounds
/// (`idle`: `--connection-idle-timeout`), and waits until every pod has its CPU.
async fn mk_target(name: &str, idle: Duration) -> Target {
    let seconds = |d: Duration| format!("{}s", d.as_secs());
    let extra_args = vec![
        "--connection-idle-timeout".to_owned(),
        seconds(idle),
        "--http2-read-idle-timeout".to_owned(),
        seconds(READ_IDLE),
        "--http2-ping-timeout".to_owned(),
        seconds(PING_TIMEOUT),
        "--write-timeout".to_owned(),
        seconds(WRITE_TIMEOUT),
        "--request-timeout".to_owned(),
        seconds(REQUEST_TIMEOUT),
        "--max-connections-per-ip".to_owned(),
        PER_IP.to_string(),
        "--max-connections".to_owned(),
        TOTAL.to_string(),
    ];
    let options = Options { nodes: 10, pods_per_node: 20, extra_args, ..Options::default() };
    let env = Env::start(name, options).await;
    env.wait_for_cpu(None).await;
    let pid = env.percolator_pid();
    let addr = env.url.trim_start_matches("https://").parse().unwrap();
    let ca = std::fs::read(env.dir.join("certs/apiserver.crt")).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&ca) {
        roots.add(cert.unwrap()).unwrap();
    }
    Target { env, pid, addr, roots: Arc::new(roots) }
}

/// A loopback address of an attacker (`127.0.0.<n>`).
fn mk_source(n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, n))
}

/// The median of `samples`.
fn mk_median(samples: &[Duration]) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    sorted[sorted.len() / 2]
}

impl Target {
    /// A series' value on `/metrics` (0 when absent).
    async fn metric(&self, series: &str) -> f64 {
        let (status, _, text) = self.env.get("/metrics", None).await;
        assert_eq!(status, 200, "{text}");
        text.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
            .map_or(0.0, |v| v.trim().parse().unwrap())
    }

    async fn vitals(&self) -> Vitals {
        let field = |name: &str| {
            procfs::status_number(self.pid, name).unwrap_or_else(|| panic!("no {name} for {}", self.pid))
        };
        let fds = procfs::open_fds(self.pid).unwrap_or_else(|| panic!("no /proc/{}/fd", self.pid));
        let tasks = self.metric("percolator_tokio_tasks_alive").await as u64;
        Vitals { rss_kib: field("VmRSS"), fds, threads: field("Threads"), tasks }
    }

    /// `n` sequential reads of [`LIST`] by the well-behaved client, each a 200; their latencies.
    async fn latencies(&self, n: usize) -> Vec<Duration> {
        let mut samples = Vec::with_capacity(n);
        for _ in 0..n {
            let start = Instant::now();
            let response = self.env.client.get(format!("{}{LIST}", self.env.url)).send().await.unwrap();
            let status = response.status();
            let body = response.bytes().await.unwrap();
            samples.push(start.elapsed());
            assert_eq!(
                status,
                200,
                "the well-behaved client was refused: {}",
                String::from_utf8_lossy(&body)
            );
            assert!(body.len() > 64 * 1024, "a list of {} bytes", body.len());
        }
        samples
    }

    /// A TCP connection from `source`.
    async fn tcp_from(&self, source: IpAddr) -> std::io::Result<TcpStream> {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(SocketAddr::new(source, 0))?;
        socket.connect(self.addr).await
    }

    /// A TLS connection from `source` offering `alpn` (none when empty).
    async fn tls_from(&self, source: IpAddr, alpn: &[u8]) -> std::io::Result<TlsStream<TcpStream>> {
        let tcp = self.tcp_from(source).await?;
        let mut config =
            rustls::ClientConfig::builder().with_root_certificates(self.roots.clone()).with_no_client_auth();
        if !alpn.is_empty() {
            config.alpn_protocols = vec![alpn.to_vec()];
        }
        let name = rustls::pki_types::ServerName::IpAddress(self.addr.ip().into());
        TlsConnector::from(Arc::new(config)).connect(name, tcp).await
    }

    /// An HTTP/2 request for `path` as the e2e user.
    fn request(&self, path: &str) -> http::Request<()> {
        http::Request::get(format!("{}{path}", self.env.url))
            .header("authorization", format!("Bearer {TESTER_TOKEN}"))
            .body(())
            .unwrap()
    }

    /// The baseline of the well-behaved client, then `attack` started, the client measured
    /// again while it runs (once `settle` resolves), and the median during it bounded by
    /// [`LATENCY_RATIO`] times the median before plus [`LATENCY_ALLOWANCE`];
    /// the vitals before and during, and the attack, still running.
    async fn under_attack(
        &self,
        name: &str,
        settle: impl Future<Output = ()>,
        attack: impl Future<Output = ()> + Send + 'static,
    ) -> Measured {
        // Warm the client's connection and the server's allocator first.
        self.latencies(10).await;
        let baseline = mk_median(&self.latencies(PROBES).await);
        let before = self.vitals().await;
        let attacking = tokio::spawn(attack);
        settle.await;
        let during_samples = self.latencies(PROBES).await;
        let during = mk_median(&during_samples);
        let vitals = self.vitals().await;
        let ratio = during.as_secs_f64() / baseline.as_secs_f64();
        println!(
            "{name}: well-behaved median {baseline:.2?} before, {during:.2?} during (x{ratio:.1}, slowest {:.2?}); before {before:?}, during {vitals:?}",
            during_samples.iter().max().unwrap()
        );
        let bound = baseline.mul_f64(LATENCY_RATIO) + LATENCY_ALLOWANCE;
        assert!(
            during <= bound,
            "{name}: the well-behaved client's median went from {baseline:?} to {during:?} (x{ratio:.1}; bound x{LATENCY_RATIO} + {LATENCY_ALLOWANCE:?} = {bound:?})"
        );
        Measured { before, during: vitals, attacking }
    }
}

/// What [`Target::under_attack`] measured, and the attack, still running.
struct Measured {
    before: Vitals,
    during: Vitals,
    attacking: tokio::task::JoinHandle<()>,
}

/// Asserts the growth of `during` over `before` is within the bounds given (memory in MiB).
fn assert_bounded(name: &str, before: Vitals, during: Vitals, memory_mib: u64, fds: u64, tasks: u64) {
    let grew = |a: u64, b: u64| b.saturating_sub(a);
    assert!(
        grew(before.rss_kib, during.rss_kib) <= memory_mib * 1024,
        "{name}: resident memory grew by {} KiB (bound {memory_mib} MiB)",
        grew(before.rss_kib, during.rss_kib)
    );
    assert!(
        grew(before.fds, during.fds) <= fds,
        "{name}: {before:?} -> {during:?}: descriptors (bound +{fds})"
    );
    assert!(
        grew(before.tasks, during.tasks) <= tasks,
        "{name}: {before:?} -> {during:?}: tasks (bound +{tasks})"
    );
    // The runtime's worker and blocking threads: none per connection or per stream.
    assert!(grew(before.threads, during.threads) <= 8, "{name}: {before:?} -> {during:?}: threads");
}

/// Reads until the peer closes the connection (or fails it); how long that took, at most
/// `within`.
async fn mk_wait_closed(
    stream: &mut (impl tokio::io::AsyncRead + Unpin),
    within: Duration,
) -> Option<Duration> {
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at((start + within).into(), stream.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return Some(start.elapsed()),
            Ok(Ok(_)) => {}
            Err(_) => return None,
        }
    }
}

// ---- raw HTTP/2 frames ----

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const END_STREAM: u8 = 0x1;

/// The frame types the attacks write or read (RFC 9113, section 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Frame {
    Headers = 0x1,
    Settings = 0x4,
    Goaway = 0x7,
    Continuation = 0x9,
}

/// One frame: its 9-byte header and `payload`.
fn mk_frame(kind: Frame, flags: u8, stream: u32, payload: &[u8]) -> Bytes {
    let mut frame = BytesMut::with_capacity(9 + payload.len());
    let len = u32::try_from(payload.len()).unwrap();
    frame.put_slice(&len.to_be_bytes()[1..]);
    frame.put_u8(kind as u8);
    frame.put_u8(flags);
    frame.put_u32(stream);
    frame.put_slice(payload);
    frame.freeze()
}

/// Reads frames until a GOAWAY (its error code and debug data) or the end of the connection.
async fn mk_read_goaway(stream: &mut (impl tokio::io::AsyncRead + Unpin)) -> Option<(u32, String)> {
    let mut buf = BytesMut::new();
    loop {
        while buf.len() >= 9 {
            let len = (usize::from(buf[0]) << 16) | (usize::from(buf[1]) << 8) | usize::from(buf[2]);
            if buf.len() < 9 + len {
                break;
            }
            let kind = buf[3];
            buf.advance(9);
            let mut payload = buf.split_to(len);
            if kind == Frame::Goaway as u8 && len >= 8 {
                payload.advance(4);
                let code = payload.get_u32();
                return Some((code, String::from_utf8_lossy(&payload).into_owned()));
            }
        }
        match stream.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

// ---- the attacks ----

/// CVE-2023-44487: HEADERS then RST_STREAM in a loop, on four connections at once (a new one
/// whenever one is sent away). The server sends a connection away (GOAWAY `ENHANCE_YOUR_CALM`)
/// once the streams its peer reset before they were served pile up; what each stream cost
/// ends with it: memory, tasks and descriptors stay bounded, and the well-behaved client is
/// served as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rapid_reset_is_bounded() {
    let target = Arc::new(mk_target("hostile-reset", IDLE).await);
    let _alone = ATTACKS.lock().await;
    let sent = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    // How each attacking connection ended (the GOAWAY's reason, if any).
    let ends = Arc::new(std::sync::Mutex::new(Vec::new()));
    let attack = {
        let (target, sent, stop, ends) = (target.clone(), sent.clone(), stop.clone(), ends.clone());
        async move {
            let attackers: Vec<_> = (0..4)
                .map(|_| {
                    let (target, sent, stop, ends) =
                        (target.clone(), sent.clone(), stop.clone(), ends.clone());
                    tokio::spawn(async move {
                        while !stop.load(Ordering::Relaxed) {
                            let end = mk_reset_flood(&target, &sent, &stop).await;
                            ends.lock().unwrap().push(end);
                        }
                    })
                })
                .collect();
            for attacker in attackers {
                attacker.await.unwrap();
            }
        }
    };
    let measured =
        target.under_attack("rapid reset", tokio::time::sleep(Duration::from_secs(2)), attack).await;
    stop.store(true, Ordering::Relaxed);
    measured.attacking.await.unwrap();
    let sent = sent.load(Ordering::Relaxed);
    let ends = std::mem::take(&mut *ends.lock().unwrap());
    let sent_away = ends.iter().flatten().count();
    let calm = ends.iter().filter(|end| **end == Some(SentAway::Calm)).count();
    let errors = target.metric("percolator_http_connections_closed_total{reason=\"error\"}").await;
    println!(
        "rapid reset: {sent} streams sent and reset on {} connections, {sent_away} of them sent away by the server ({calm} GOAWAY ENHANCE_YOUR_CALM read, the others closed before it was; {errors} counted), {:.0} streams each",
        ends.len(),
        sent as f64 / ends.len() as f64
    );
    assert!(sent >= 5_000, "the attack sent only {sent} streams");
    // Every connection but the last of each attacker (stopped by the test) was sent away.
    assert!(sent_away + 4 >= ends.len() && calm > 0, "{ends:?}");
    assert!(errors >= sent_away as f64, "the server counted {errors} connections ended by an error");
    // Tasks are bounded by the streams the attacking connections may have open (4 × 1,000);
    // a stream reset as it arrives leaves none behind, so a few are seen.
    assert_bounded("rapid reset", measured.before, measured.during, 32, 32, 4 * 1000);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = target.vitals().await;
    println!("rapid reset: after {after:?}");
    assert_bounded("rapid reset, after", measured.before, after, 32, 16, 50);
}

/// How the server ended a rapid-reset connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SentAway {
    /// A GOAWAY `ENHANCE_YOUR_CALM` the client read.
    Calm,
    /// The connection closed under the client's writes (the GOAWAY before it unread).
    Closed,
}

/// One rapid-reset connection from 127.0.0.2: streams of [`LIST`] sent and reset at once
/// (counted in `sent`) until the server sends it away (how) or `stop` (`None`).
async fn mk_reset_flood(target: &Target, sent: &AtomicU64, stop: &AtomicBool) -> Option<SentAway> {
    let tls = target.tls_from(mk_source(2), b"h2").await.ok()?;
    let (mut client, connection) = h2::client::Builder::new()
        .max_concurrent_reset_streams(100_000)
        .handshake::<_, Bytes>(tls)
        .await
        .ok()?;
    let connection = tokio::spawn(connection);
    for n in 1u64.. {
        if stop.load(Ordering::Relaxed) {
            return None;
        }
        let Ok(ready) = client.ready().await else { break };
        client = ready;
        let Ok((response, _)) = client.send_request(target.request(LIST), true) else { break };
        if n % 256 == 0 {
            // One answer awaited now and then: the frames before it have left, so the
            // client's own queue stays short.
            if !matches!(tokio::time::timeout(Duration::from_secs(10), response).await, Ok(Ok(_))) {
                break;
            }
        } else {
            // Dropped at once: the client resets the stream (CANCEL).
            drop(response);
            sent.fetch_add(1, Ordering::Relaxed);
        }
        // 2,500 streams a second per connection, in bursts of 25: the attacker shares the
        // test machine's two cores with the server, and a machine saturated by the test
        // itself would measure nothing.
        if n % 25 == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        } else {
            tokio::task::yield_now().await;
        }
    }
    match tokio::time::timeout(Duration::from_secs(5), connection).await {
        Ok(Ok(Err(error))) if error.reason() == Some(h2::Reason::ENHANCE_YOUR_CALM) => Some(SentAway::Calm),
        // The server closed the connection before the client read its GOAWAY.
        Ok(Ok(Err(error))) if error.is_io() => Some(SentAway::Closed),
        other => panic!("a rapid-reset connection ended otherwise: {other:?}"),
    }
}

/// HEADERS without END_HEADERS, then CONTINUATION frames without end: h2 refuses a header
/// block in more frames than the header list limit needs with a GOAWAY `ENHANCE_YOUR_CALM`
/// (`too_many_continuations`) and the connection ends, however long the attacker goes on;
/// five connections at a time doing it over and over leave the well-behaved client served.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_continuation_flood_is_sent_away() {
    let target = Arc::new(mk_target("hostile-continuation", IDLE).await);
    let _alone = ATTACKS.lock().await;
    /// One flood on a new connection: the GOAWAY the server answered with, and how long it
    /// took to close the connection.
    async fn mk_continuation_flood(target: &Target, frames: &AtomicU64) -> Option<((u32, String), Duration)> {
        let tls = target.tls_from(mk_source(3), b"h2").await.ok()?;
        let (mut reader, mut writer) = tokio::io::split(tls);
        let start = Instant::now();
        let goaway = tokio::spawn(async move {
            let goaway = mk_read_goaway(&mut reader).await;
            let closed = mk_wait_closed(&mut reader, Duration::from_secs(10)).await;
            (goaway, closed.map(|_| start.elapsed()))
        });
        // GET / with a header `x-a` announced 1 MiB long, its value to follow.
        let mut block = vec![0x82, 0x87, 0x84, 0x40, 0x03, b'x', b'-', b'a', 0x7f];
        let mut rest = (1usize << 20) - 127;
        while rest >= 128 {
            block.push(u8::try_from(rest % 128).unwrap() | 0x80);
            rest /= 128;
        }
        block.push(u8::try_from(rest).unwrap());
        let _ = writer.write_all(PREFACE).await;
        let _ = writer.write_all(&mk_frame(Frame::Settings, 0, 0, &[])).await;
        let _ = writer.write_all(&mk_frame(Frame::Headers, END_STREAM, 1, &block)).await;
        let piece = vec![b'a'; 1024];
        for _ in 0..100_000 {
            if goaway.is_finished()
                || writer.write_all(&mk_frame(Frame::Continuation, 0, 1, &piece)).await.is_err()
            {
                break;
            }
            frames.fetch_add(1, Ordering::Relaxed);
        }
        let (goaway, closed) = goaway.await.ok()?;
        Some((goaway?, closed?))
    }
    let frames = Arc::new(AtomicU64::new(0));
    let floods = Arc::new(std::sync::Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let attack = {
        let (target, frames, floods, stop) = (target.clone(), frames.clone(), floods.clone(), stop.clone());
        async move {
            let mut attackers = Vec::new();
            for _ in 0..5 {
                let (target, frames, floods, stop) =
                    (target.clone(), frames.clone(), floods.clone(), stop.clone());
                attackers.push(tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let outcome = mk_continuation_flood(&target, &frames).await;
                        floods.lock().unwrap().push(outcome);
                        // Each flood is a new TLS handshake: paced, so that the test machine's
                        // two cores measure the flood rather than a handshake storm.
                        tokio::time::sleep(Duration::from_millis(40)).await;
                    }
                }));
            }
            for attacker in attackers {
                let _ = attacker.await;
            }
        }
    };
    let measured =
        target.under_attack("CONTINUATION flood", tokio::time::sleep(Duration::from_secs(2)), attack).await;
    stop.store(true, Ordering::Relaxed);
    let _ = measured.attacking.await;
    let floods = std::mem::take(&mut *floods.lock().unwrap());
    let frames = frames.load(Ordering::Relaxed);
    let slowest = floods.iter().flatten().map(|(_, took)| *took).max();
    println!(
        "CONTINUATION flood: {} connections, {frames} CONTINUATION frames written in all, each connection closed within {slowest:?}",
        floods.len()
    );
    assert!(floods.len() >= 100, "only {} floods", floods.len());
    for outcome in &floods {
        let ((code, debug), took) =
            outcome.as_ref().expect("the server answered a flood with a GOAWAY and closed");
        assert_eq!(
            (*code, debug.as_str()),
            (u32::from(h2::Reason::ENHANCE_YOUR_CALM), "too_many_continuations")
        );
        assert!(*took < Duration::from_secs(2), "a flooding connection stayed open {took:?}");
    }
    assert_bounded("CONTINUATION flood", measured.before, measured.during, 32, 64, 200);
}

/// Connections that go silent: after the TCP connect (closed at the handshake timeout), after
/// the TLS handshake with each ALPN choice (closed at the idle timeout), after the HTTP/2
/// preface (closed when the keep-alive PING goes unanswered), a hundred of each at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn silent_connections_are_closed_in_time() {
    let target = Arc::new(mk_target("hostile-silence", IDLE).await);
    let _alone = ATTACKS.lock().await;
    const EACH: usize = 100;
    // The kinds of silence, with the bound that closes each.
    let kinds: [(&str, Duration); 5] = [
        ("TCP connect", HANDSHAKE_TIMEOUT),
        ("TLS, ALPN h2", IDLE + PING_TIMEOUT),
        ("TLS, ALPN http/1.1", IDLE + PING_TIMEOUT),
        ("TLS, no ALPN", IDLE + PING_TIMEOUT),
        ("HTTP/2 preface", READ_IDLE + PING_TIMEOUT),
    ];
    let closed = Arc::new(std::sync::Mutex::new(Vec::new()));
    let attack = {
        let (target, closed) = (target.clone(), closed.clone());
        async move {
            let mut silent = Vec::new();
            for (kind, (name, bound)) in kinds.into_iter().enumerate() {
                for _ in 0..EACH {
                    let (target, closed) = (target.clone(), closed.clone());
                    silent.push(tokio::spawn(async move {
                        let source = mk_source(10 + u8::try_from(kind).unwrap());
                        let took = match kind {
                            0 => {
                                let mut tcp = target.tcp_from(source).await.unwrap();
                                mk_wait_closed(&mut tcp, bound + SLACK * 2).await
                            }
                            1..=3 => {
                                let alpn: &[u8] = [&b"h2"[..], b"http/1.1", b""][kind - 1];
                                let mut tls = target.tls_from(source, alpn).await.unwrap();
                                mk_wait_closed(&mut tls, bound + SLACK * 2).await
                            }
                            _ => {
                                let mut tls = target.tls_from(source, b"h2").await.unwrap();
                                tls.write_all(PREFACE).await.unwrap();
                                tls.write_all(&mk_frame(Frame::Settings, 0, 0, &[])).await.unwrap();
                                tls.flush().await.unwrap();
                                mk_wait_closed(&mut tls, bound + SLACK * 2).await
                            }
                        };
                        closed.lock().unwrap().push((name, bound, took));
                    }));
                }
            }
            for connection in silent {
                connection.await.unwrap();
            }
        }
    };
    let measured =
        target.under_attack("silence", tokio::time::sleep(Duration::from_millis(500)), attack).await;
    measured.attacking.await.unwrap();
    let closed = std::mem::take(&mut *closed.lock().unwrap());
    assert_eq!(closed.len(), 5 * EACH);
    for (name, bound) in kinds {
        let took: Vec<Option<Duration>> =
            closed.iter().filter(|(n, ..)| *n == name).map(|(_, _, took)| *took).collect();
        let slowest = took.iter().max().copied().flatten();
        println!(
            "silence, {name}: {} connections, the last closed after {slowest:?} (bound {bound:?})",
            took.len()
        );
        assert!(took.iter().all(Option::is_some), "{name}: a connection was never closed");
        assert!(slowest.unwrap() <= bound + SLACK, "{name}: closed after {slowest:?}, bound {bound:?}");
        let fastest = took.iter().min().copied().flatten().unwrap();
        assert!(fastest + SLACK >= bound, "{name}: closed after {fastest:?} already, bound {bound:?}");
    }
    let count = async |reason: &str| {
        target.metric(&format!("percolator_http_connections_closed_total{{reason=\"{reason}\"}}")).await
    };
    assert!(count("handshake_timeout").await >= EACH as f64);
    assert!(count("idle_timeout").await >= 3.0 * EACH as f64);
    assert!(count("ping_timeout").await >= EACH as f64);
    // 500 connections open at once: each a task, a descriptor and its buffers, nothing more.
    assert_bounded(
        "silence",
        measured.before,
        measured.during,
        48,
        5 * EACH as u64 + 16,
        5 * EACH as u64 + 50,
    );
    let after = target.vitals().await;
    println!("silence: after {after:?}");
    assert_bounded("silence, after", measured.before, after, 48, 16, 50);
}

/// Readers that never open their flow-control window (SETTINGS_INITIAL_WINDOW_SIZE 0, no
/// WINDOW_UPDATE), each with a thousand streams of the list on each of two connections:
/// every stream ends (reset) by --request-timeout + --write-timeout, they hold none of the
/// server's in-flight seats meanwhile, and the well-behaved client is served as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn zero_window_readers_are_reset_in_time() {
    let target = Arc::new(mk_target("hostile-zero-window", IDLE).await);
    let _alone = ATTACKS.lock().await;
    const STREAMS: usize = 1000;
    let lifetime = REQUEST_TIMEOUT + WRITE_TIMEOUT;
    let ended = Arc::new(std::sync::Mutex::new(Vec::new()));
    let attack = {
        let (target, ended) = (target.clone(), ended.clone());
        async move {
            let mut streams = Vec::new();
            for _ in 0..2 {
                let tls = target.tls_from(mk_source(4), b"h2").await.unwrap();
                let (mut client, connection) = h2::client::Builder::new()
                    .initial_window_size(0)
                    .handshake::<_, Bytes>(tls)
                    .await
                    .unwrap();
                tokio::spawn(connection);
                for _ in 0..STREAMS {
                    client = client.ready().await.unwrap();
                    let start = Instant::now();
                    let (response, _) = client.send_request(target.request(LIST), true).unwrap();
                    let ended = ended.clone();
                    streams.push(tokio::spawn(async move {
                        let outcome = match response.await {
                            Ok(response) => {
                                let status = response.status().as_u16();
                                let mut body = response.into_body();
                                // Never released: the window stays closed.
                                let mut received = 0;
                                let reset = loop {
                                    match body.data().await {
                                        Some(Ok(data)) => received += data.len(),
                                        Some(Err(error)) => break error.reason(),
                                        None => break None,
                                    }
                                };
                                (Some(status), received, reset)
                            }
                            Err(error) => (None, 0, error.reason()),
                        };
                        ended.lock().unwrap().push((outcome, start.elapsed()));
                    }));
                }
            }
            for stream in streams {
                stream.await.unwrap();
            }
        }
    };
    let measured =
        target.under_attack("zero window", tokio::time::sleep(Duration::from_secs(1)), attack).await;
    let in_flight = target.metric("percolator_http_requests_in_flight").await;
    tokio::time::timeout(lifetime + SLACK * 2, measured.attacking)
        .await
        .expect("every stream ended")
        .unwrap();
    let ended = std::mem::take(&mut *ended.lock().unwrap());
    let slowest = ended.iter().map(|(_, took)| *took).max().unwrap();
    let received: usize = ended.iter().map(|((_, received, _), _)| received).sum();
    let reset = ended.iter().filter(|((_, _, reason), _)| *reason == Some(h2::Reason::CANCEL)).count();
    println!(
        "zero window: {} streams, {reset} reset by the server, the last after {slowest:?} (bound {lifetime:?}); {received} body bytes received; {in_flight} requests in flight during",
        ended.len()
    );
    assert_eq!(ended.len(), 2 * STREAMS);
    assert!(slowest <= lifetime + SLACK, "a stream lived {slowest:?}, bound {lifetime:?}");
    assert_eq!(received, 0, "the window was never opened");
    assert_eq!(reset, 2 * STREAMS, "every stream was reset by the server");
    let timeouts = target.metric("percolator_http2_stream_write_timeouts_total").await;
    assert!(timeouts >= 2.0 * STREAMS as f64, "{timeouts} streams counted");
    // Two thousand streams waiting: each a task and a response shared with the cache.
    assert_bounded("zero window", measured.before, measured.during, 96, 16, 2 * STREAMS as u64 + 100);
    let after = target.vitals().await;
    println!("zero window: after {after:?}");
    assert_bounded("zero window, after", measured.before, after, 96, 16, 100);
}

/// Thousands of idle connections: 1,500 from each of two addresses (TLS, one offering
/// HTTP/1.1, the other HTTP/2), of which --max-connections-per-ip (300) are kept from each and
/// the rest closed at accept; then 600 from a third address, of which the total bound
/// (--max-connections, 1,000) keeps 400. The well-behaved client, connected before, is served
/// as before; every refusal is counted by its limit. (The idle timeout is 30 s here, so that
/// the connections kept stay open while they are counted; the silence test covers it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_connections_are_bounded_per_address_and_in_all() {
    let target = Arc::new(mk_target("hostile-idle", Duration::from_secs(30)).await);
    let _alone = ATTACKS.lock().await;
    const ATTEMPTS: usize = 1500;
    let held = Arc::new(tokio::sync::Mutex::new(Vec::new()));
    let kept = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (done, opened) = tokio::sync::oneshot::channel();
    let opened = async move {
        let _ = opened.await;
    };
    let attack = {
        let (target, held, kept) = (target.clone(), held.clone(), kept.clone());
        async move {
            let (h1, h2) = tokio::join!(
                mk_open(&target, mk_source(5), ATTEMPTS, b"http/1.1"),
                mk_open(&target, mk_source(6), ATTEMPTS, b"h2")
            );
            kept.lock().unwrap().extend([h1.len(), h2.len()]);
            let mut held = held.lock().await;
            held.extend(h1);
            held.extend(h2);
            let _ = done.send(());
        }
    };
    // Measured once they are all open: what idle connections cost others, not the handshakes
    // that opened them.
    let measured = target.under_attack("idle connections", opened, attack).await;
    measured.attacking.await.unwrap();
    let kept = kept.lock().unwrap().clone();
    let during = target.vitals().await;
    let open = target.metric("percolator_http_connections").await;
    let per_ip =
        target.metric("percolator_http_connections_rejected_total{reason=\"max_connections_per_ip\"}").await;
    println!(
        "idle connections: kept {kept:?} of {ATTEMPTS} from each address; {open} open; {per_ip} refused by the per-address limit; {during:?}"
    );
    assert_eq!(kept, [PER_IP, PER_IP]);
    assert_eq!(per_ip, (2 * (ATTEMPTS - PER_IP)) as f64);
    // What 600 idle TLS connections hold: each a task, a descriptor and its buffers.
    assert_bounded(
        "idle connections",
        measured.before,
        during,
        64,
        2 * PER_IP as u64 + 16,
        2 * PER_IP as u64 + 50,
    );

    // The total bound: 250 more from each of two other addresses, with 600 (and the
    // well-behaved client's) open and 1,000 allowed.
    let (third, fourth) =
        tokio::join!(mk_open(&target, mk_source(7), 250, b"h2"), mk_open(&target, mk_source(8), 250, b"h2"));
    let total = target.metric("percolator_http_connections_rejected_total{reason=\"max_connections\"}").await;
    let after_total = target.metric("percolator_http_connections").await;
    let more = third.len() + fourth.len();
    println!(
        "idle connections: {more} of 500 more kept, {total} refused by the total limit, {after_total} open"
    );
    assert_eq!(after_total, TOTAL as f64, "the total bound");
    let room = TOTAL - open as usize;
    // The room left (give or take the test client's and Prometheus' own connections) taken.
    assert!(more <= room + 2 && more + 2 >= room, "{more} kept, {room} places were left");
    // Every other attempt refused by the total bound (Prometheus' scrapes, refused too while
    // the bound is reached, may add to it).
    assert!(total >= (500 - more) as f64 && total <= (500 - more + 5) as f64, "{total} refused");
    drop((third, fourth));
    drop(std::mem::take(&mut *held.lock().await));
    // Closed by the clients: the server lets go of them all.
    let deadline = Instant::now() + SLACK * 2;
    while target.metric("percolator_http_connections").await > 10.0 {
        assert!(Instant::now() < deadline, "connections still counted after their clients closed them");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let after = target.vitals().await;
    println!("idle connections: after {after:?}");
    assert_bounded("idle connections, after", measured.before, after, 64, 16, 50);
}

/// Opens `n` TLS connections offering `alpn` from `source`, 100 at a time; the ones still open
/// a moment later (a refused connection is closed at accept, so its handshake fails).
async fn mk_open(target: &Target, source: IpAddr, n: usize, alpn: &[u8]) -> Vec<TlsStream<TcpStream>> {
    let mut opened = Vec::new();
    for first in (0..n).step_by(100) {
        let batch = (first..n.min(first + 100)).map(|_| target.tls_from(source, alpn));
        opened.extend(futures::future::join_all(batch).await.into_iter().flatten());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let checked = opened.into_iter().map(|mut stream| async move {
        mk_wait_closed(&mut stream, Duration::from_millis(100)).await.is_none().then_some(stream)
    });
    futures::future::join_all(checked).await.into_iter().flatten().collect()
}
