//! Network namespaces for the faults the simulator cannot make (`tests/e2e_netns.rs`): packets
//! silently dropped between percolator and one upstream, in both directions or in one.
//!
//! Two namespaces made by the test, joined by one veth pair, are the only places holding an
//! address of the private range `10.211.0.0/24`: the client namespace (percolator, and the test
//! itself) and the upstream namespace (the simulated kube-apiserver and kubelets, Prometheus).
//! The host's own namespace gets no interface, address, route or qdisc, so nothing is sent
//! anywhere but to loopback and across that veth; both namespaces, and the veth with them, are
//! removed when the test ends, passes or fails ([`Namespaces`], a Drop guard; those a killed
//! run left are removed by the next one).
//!
//! A process cannot move its own sockets into a namespace without `setns(2)`, which the
//! standard library does not offer: the test runs its own executable again inside the client
//! namespace (`ip netns exec`) with the layout in [`INNER_ENV`], and that inner run does the
//! work ([`mk_inside`]); the outer one makes and removes the namespaces and relays its output.
//!
//! Drops: each veth end has an HTB root qdisc with no default class, so what no filter picks
//! passes untouched, and one class whose queue is a `blackhole` qdisc; a u32 filter sends a
//! flow there ([`Layout::drop_flows`]). That needs only `sch_htb`, `cls_u32` and
//! `sch_blackhole`: `netem` and the `gact` drop action are missing from some kernels.
//!
//! An upstream's end of its connections can be closed while its flows are dropped
//! ([`Layout::kill_connections`], `ss -K` inside the upstream namespace): the kernel destroys
//! the sockets and sends resets that the blackhole drops, so percolator's ends stay open on
//! connections nothing will ever answer on again. A test that needs it calls
//! [`mk_inside_killing`], which first tries `ss -K` on a loopback connection of its own (the
//! kernel needs `CONFIG_INET_DIAG_DESTROY`).

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::Mutex;

/// Set (to `<client namespace> <upstream namespace>`) in the run inside the client namespace.
pub(crate) const INNER_ENV: &str = "PERCOLATOR_NETNS_INNER";
/// Prefix of the namespaces' names: `<prefix><pid>-<n>-c` and `…-u`.
const PREFIX: &str = "percolator-netns-";
/// The veth's end in the client namespace.
pub(crate) const CLIENT_DEV: &str = "vc";
/// The veth's end in the upstream namespace.
pub(crate) const UPSTREAM_DEV: &str = "vu";
/// The client namespace's address (percolator's source address).
pub(crate) const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 211, 0, 1);
/// The simulated kube-apiserver, its control port and Prometheus.
pub(crate) const UPSTREAM_IP: Ipv4Addr = Ipv4Addr::new(10, 211, 0, 2);
/// node-0's InternalIP (its kubelet's address); node i has this plus i.
pub(crate) const NODE_IP_START: Ipv4Addr = Ipv4Addr::new(10, 211, 0, 10);
/// Nodes of the simulated cluster.
pub(crate) const NODES: u32 = 3;
/// The simulated kube-apiserver's port. The ports in the upstream namespace are fixed: nothing
/// else lives there.
pub(crate) const API_PORT: u16 = 6443;
/// The simulator's metrics and control port (`/sim/*`), which no fault drops.
pub(crate) const CONTROL_PORT: u16 = 8080;
/// Every kubelet's port, each on its node's address.
pub(crate) const KUBELET_PORT: u16 = 10250;
/// Prometheus' port.
pub(crate) const PROMETHEUS_PORT: u16 = 9090;
/// Scrape interval of the Prometheus in the upstream namespace (and its backfill step).
const SCRAPE: Duration = Duration::from_secs(2);
/// How long the inner run may take before the outer one stops it.
const INNER_LIMIT: Duration = Duration::from_secs(240);

/// One upstream's listening address, whose flows a fault drops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Endpoint {
    pub ip: Ipv4Addr,
    pub port: u16,
}

/// The simulated kube-apiserver.
pub(crate) const API: Endpoint = Endpoint { ip: UPSTREAM_IP, port: API_PORT };
/// Prometheus.
pub(crate) const PROMETHEUS: Endpoint = Endpoint { ip: UPSTREAM_IP, port: PROMETHEUS_PORT };
/// node-0's kubelet.
pub(crate) const KUBELET_0: Endpoint = Endpoint { ip: NODE_IP_START, port: KUBELET_PORT };

/// Which packets of a flow are dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Both ways: a blackhole (a SYN is never answered, nor refused).
    Both,
    /// Only what the upstream sends: requests arrive, answers (and SYN-ACKs) are lost.
    RepliesOnly,
}

/// Where a connection is seen from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// The client namespace: percolator's ends.
    Client,
    /// The upstream namespace: the ends an upstream accepted.
    Upstream,
}

/// One TCP socket as `ss` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Socket {
    /// `ESTAB`, `CLOSE-WAIT`, `SYN-SENT`…
    pub state: String,
    /// `address:port` of this end.
    pub local: String,
    /// `address:port` of the other end.
    pub peer: String,
}

/// The two namespaces of one test, as the run inside the client namespace knows them.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub client: String,
    pub upstream: String,
}

/// Filters installed by [`Layout::drop_flows`], removed by [`Dropping::lift`] (or on drop).
pub(crate) struct Dropping {
    filters: Vec<(String, &'static str, u32)>,
}

impl Layout {
    /// Drops the flows of `endpoints` in `direction` from now on: u32 filters on the upstream
    /// end's egress (what an endpoint sends) and, for [`Direction::Both`], on the client end's
    /// egress (what is sent to it).
    pub(crate) fn drop_flows(&self, endpoints: &[Endpoint], direction: Direction) -> Dropping {
        static PRIO: AtomicU32 = AtomicU32::new(10);
        let mut filters = Vec::new();
        for e in endpoints {
            let mut sides = vec![(&self.upstream, UPSTREAM_DEV, "src", "sport")];
            if direction == Direction::Both {
                sides.push((&self.client, CLIENT_DEV, "dst", "dport"));
            }
            for (ns, dev, addr, port) in sides {
                let prio = PRIO.fetch_add(1, Ordering::Relaxed);
                let (ip, p, prio_s) = (format!("{}/32", e.ip), e.port.to_string(), prio.to_string());
                mk_run(
                    "tc",
                    &[
                        "-n", ns, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio",
                        &prio_s, "u32", "match", "ip", "protocol", "6", "0xff", "match", "ip", addr, &ip,
                        "match", "ip", port, &p, "0xffff", "flowid", "1:2",
                    ],
                )
                .unwrap_or_else(|e| panic!("installing a drop filter: {e}"));
                filters.push((ns.clone(), dev, prio));
            }
        }
        Dropping { filters }
    }

    /// Packets dropped so far by the blackhole queues: (client end, upstream end).
    pub(crate) fn dropped(&self) -> (u64, u64) {
        let count = |ns: &str, dev: &str| -> u64 {
            let out = mk_run("tc", &["-s", "-n", ns, "qdisc", "show", "dev", dev])
                .unwrap_or_else(|e| panic!("reading the qdisc counters: {e}"));
            // `qdisc blackhole 20: parent 1:2` then ` Sent 0 bytes 0 pkt (dropped N, …`.
            let after =
                out.split("qdisc blackhole").nth(1).unwrap_or_else(|| panic!("no blackhole qdisc: {out}"));
            after
                .split("dropped ")
                .nth(1)
                .and_then(|rest| rest.split(',').next())
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or_else(|| panic!("no drop counter in {out}"))
        };
        (count(&self.client, CLIENT_DEV), count(&self.upstream, UPSTREAM_DEV))
    }

    /// The TCP sockets of `endpoint`'s connections seen from `side`, in every state `ss` shows
    /// by default (listening and TIME-WAIT excepted): in the upstream namespace the ends it
    /// accepted, in the client namespace the ends made to it.
    pub(crate) fn connections(&self, side: Side, endpoint: Endpoint) -> Vec<Socket> {
        let (ns, filter) = self.socket_filter(side, endpoint);
        let out = mk_run("ss", &["-N", ns, "-tnH", &filter])
            .unwrap_or_else(|e| panic!("listing the connections of {endpoint:?}: {e}"));
        mk_sockets(&out)
    }

    /// Closes the upstream's end of every connection of `endpoint` (`ss -K` in the upstream
    /// namespace: each socket destroyed and a reset sent, which a blackhole of the flow drops);
    /// the sockets closed.
    pub(crate) fn kill_connections(&self, endpoint: Endpoint) -> Vec<Socket> {
        let (ns, filter) = self.socket_filter(Side::Upstream, endpoint);
        let out = mk_run("ss", &["-N", ns, "-K", "-tnH", &filter])
            .unwrap_or_else(|e| panic!("closing the connections of {endpoint:?}: {e}"));
        mk_sockets(&out)
    }

    /// The namespace that sees `endpoint` from `side`, and the `ss` filter of its connections.
    fn socket_filter(&self, side: Side, e: Endpoint) -> (&str, String) {
        match side {
            Side::Upstream => (&self.upstream, format!("src {} and sport = :{}", e.ip, e.port)),
            Side::Client => (&self.client, format!("dst {} and dport = :{}", e.ip, e.port)),
        }
    }

    /// A command run inside the upstream namespace.
    pub(crate) fn upstream_command(&self, program: impl AsRef<std::ffi::OsStr>) -> tokio::process::Command {
        let mut command = tokio::process::Command::new("ip");
        command.args(["netns", "exec", &self.upstream]).arg(program).kill_on_drop(true);
        command
    }
}

impl Dropping {
    /// Removes the filters: the flows pass again.
    pub(crate) fn lift(mut self) {
        self.remove();
    }

    fn remove(&mut self) {
        for (ns, dev, prio) in self.filters.drain(..) {
            let prio = prio.to_string();
            mk_run("tc", &["-n", &ns, "filter", "del", "dev", dev, "parent", "1:", "prio", &prio])
                .unwrap_or_else(|e| panic!("removing a drop filter: {e}"));
        }
    }
}

impl Drop for Dropping {
    fn drop(&mut self) {
        // Lifted already, or the test is failing: the namespaces go anyway.
        if !std::thread::panicking() {
            self.remove();
        }
    }
}

/// Runs `program args`; its stdout, or what went wrong (the command and its stderr).
fn mk_run(program: &str, args: &[&str]) -> Result<String, String> {
    let output =
        Command::new(program).args(args).output().map_err(|e| format!("`{program}` cannot be run: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// The sockets of `ss -tnH` output (`State Recv-Q Send-Q Local Peer`).
fn mk_sockets(out: &str) -> Vec<Socket> {
    out.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            [state, _, _, local, peer, ..] => {
                Socket { state: state.to_owned(), local: local.to_owned(), peer: peer.to_owned() }
            }
            _ => panic!("an `ss` line that is not `State Recv-Q Send-Q Local Peer`: {l:?}"),
        })
        .collect()
}

/// The namespaces of one test, made by [`Namespaces::create`]; on drop, what still runs in them
/// (the test's own processes, e.g. after the inner run was stopped) is killed and both are
/// deleted, which deletes the veth pair.
struct Namespaces {
    names: Vec<String>,
}

impl Namespaces {
    /// Makes the two namespaces, the veth pair between them, their addresses and the drop
    /// queues; what failed, in the words of `ip` or `tc`, when the machine does not allow it.
    fn create() -> Result<(Self, Layout), String> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let base = format!("{PREFIX}{}-{n}", std::process::id());
        let layout = Layout { client: format!("{base}-c"), upstream: format!("{base}-u") };
        let mut made = Self { names: Vec::new() };
        for ns in [&layout.client, &layout.upstream] {
            mk_run("ip", &["netns", "add", ns])?;
            made.names.push(ns.clone());
            mk_run("ip", &["-n", ns, "link", "set", "lo", "up"])?;
        }
        let (c, u) = (layout.client.as_str(), layout.upstream.as_str());
        // Made inside the namespaces: the host's namespace never holds either end.
        let veth = format!("link add {CLIENT_DEV} netns {c} type veth peer name {UPSTREAM_DEV} netns {u}");
        mk_run("ip", &veth.split(' ').collect::<Vec<_>>())?;
        let mut addresses = vec![(c, CLIENT_DEV, CLIENT_IP), (u, UPSTREAM_DEV, UPSTREAM_IP)];
        addresses.extend((0..NODES).map(|i| (u, UPSTREAM_DEV, Ipv4Addr::from(u32::from(NODE_IP_START) + i))));
        for (ns, dev, ip) in addresses {
            mk_run("ip", &["-n", ns, "addr", "add", &format!("{ip}/24"), "dev", dev])?;
        }
        for (ns, dev) in [(c, CLIENT_DEV), (u, UPSTREAM_DEV)] {
            mk_run("ip", &["-n", ns, "link", "set", dev, "up"])?;
            // No default class: unfiltered packets are sent directly, unshaped.
            mk_run("tc", &["-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb"])?;
            mk_run(
                "tc",
                &[
                    "-n", ns, "class", "add", "dev", dev, "parent", "1:", "classid", "1:2", "htb", "rate",
                    "1gbit", "quantum", "60000",
                ],
            )?;
            mk_run(
                "tc",
                &["-n", ns, "qdisc", "add", "dev", dev, "parent", "1:2", "handle", "20:", "blackhole"],
            )?;
        }
        Ok((made, layout))
    }

    /// Kills what runs in namespace `ns` and deletes it.
    fn remove(ns: &str) {
        if let Ok(pids) = mk_run("ip", &["netns", "pids", ns]) {
            for pid in pids.split_whitespace() {
                let _ = Command::new("kill").args(["-KILL", pid]).status();
            }
        }
        // A killed process leaves its namespace a moment later; deleting the name does not
        // wait for that, and the veth goes with the namespace's last reference.
        let _ = mk_run("ip", &["netns", "del", ns]);
    }

    /// Removes the namespaces of test processes that are gone (the pid in their name is not
    /// running): a run killed before its guard could drop.
    fn remove_dead_runs() {
        let Ok(entries) = std::fs::read_dir("/run/netns") else { return };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(rest) = name.strip_prefix(PREFIX) else { continue };
            let pid = rest.split('-').next().and_then(|p| p.parse::<u32>().ok());
            if let Some(pid) = pid
                && !super::procfs::alive(pid)
            {
                Self::remove(&name);
            }
        }
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for ns in &self.names {
            Self::remove(ns);
        }
    }
}

/// Why this machine cannot run the test, if it cannot: not root, or no `ip`/`tc`.
fn mk_missing_prerequisite() -> Option<String> {
    let uids = super::procfs::status("self", "Uid").unwrap_or_default();
    let euid = uids.split_whitespace().nth(1);
    if euid != Some("0") {
        return Some(format!(
            "not root (effective uid {}): network namespaces need it",
            euid.unwrap_or("unknown")
        ));
    }
    for (program, flag) in [("ip", "-V"), ("tc", "-V")] {
        if let Err(e) = mk_run(program, &[flag]) {
            return Some(e);
        }
    }
    None
}

/// Says, outside the test harness' capture so that it shows in every run, that `test` did
/// not run and why.
fn report_skip(test: &str, why: &str) {
    let _ = writeln!(std::io::stderr(), "SKIPPED: e2e_netns::{test}: {why}");
}

/// Why `ss -K` cannot close a connection on this machine, if it cannot (no `ss`, or a kernel
/// without `CONFIG_INET_DIAG_DESTROY`, where it closes nothing and says so only on stderr):
/// tried on a loopback connection of this process's own, the only socket its filter matches.
fn mk_socket_kill_missing() -> Option<String> {
    let probe = || -> std::io::Result<(std::net::TcpStream, std::net::TcpStream)> {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let client = std::net::TcpStream::connect(listener.local_addr()?)?;
        Ok((client, listener.accept()?.0))
    };
    let (client, accepted) = match probe() {
        Ok(pair) => pair,
        Err(e) => return Some(format!("no loopback connection to try `ss -K` on: {e}")),
    };
    let filter = format!(
        "src 127.0.0.1 and sport = :{} and dport = :{}",
        accepted.local_addr().unwrap().port(),
        client.local_addr().unwrap().port()
    );
    if let Err(e) = mk_run("ss", &["-K", "-tnH", &filter]) {
        return Some(e);
    }
    match mk_run("ss", &["-tnH", &filter]) {
        Err(e) => Some(e),
        Ok(left) if !left.trim().is_empty() => Some(format!(
            "`ss -K` closes no socket here (a kernel without CONFIG_INET_DIAG_DESTROY?): still open: {}",
            left.trim()
        )),
        Ok(_) => None,
    }
}

/// [`mk_inside`] for a test that closes an upstream's connections
/// ([`Layout::kill_connections`]): where `ss -K` cannot, says so (`SKIPPED: …`) and returns
/// `None` without running anything.
pub(crate) fn mk_inside_killing(test: &str) -> Option<Layout> {
    if std::env::var_os(INNER_ENV).is_none()
        && let Some(why) = mk_missing_prerequisite().or_else(mk_socket_kill_missing)
    {
        report_skip(test, &why);
        return None;
    }
    mk_inside(test)
}

/// Where test `test` runs. Inside its client namespace: the layout, to run the test there.
/// Outside: `None`, after making the namespaces, running this executable again inside the
/// client namespace for `test` alone, relaying its output and removing the namespaces; panics
/// when that run fails. Where the machine does not allow namespaces, says so (`SKIPPED: …` on
/// stderr, past the harness' capture) and returns `None` without running anything.
pub(crate) fn mk_inside(test: &str) -> Option<Layout> {
    if let Ok(names) = std::env::var(INNER_ENV) {
        let (client, upstream) = names.split_once(' ').unwrap_or_else(|| panic!("{INNER_ENV}={names}"));
        return Some(Layout { client: client.to_owned(), upstream: upstream.to_owned() });
    }
    if let Some(why) = mk_missing_prerequisite() {
        report_skip(test, &why);
        return None;
    }
    Namespaces::remove_dead_runs();
    let (namespaces, layout) = match Namespaces::create() {
        Ok(made) => made,
        Err(why) => {
            report_skip(test, &format!("the network namespaces or their drop queues cannot be made: {why}"));
            return None;
        }
    };
    let exe = std::env::current_exe().unwrap();
    let mut inner = Command::new("ip")
        .args(["netns", "exec", &layout.client])
        .arg(&exe)
        .args([test, "--exact", "--nocapture", "--test-threads", "1"])
        .env(INNER_ENV, format!("{} {}", layout.client, layout.upstream))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running {} inside {}: {e}", exe.display(), layout.client));
    // Relayed through the harness' capture: shown with --nocapture or on failure.
    let relays: Vec<_> = [
        Box::new(inner.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(inner.stderr.take().unwrap()),
    ]
    .into_iter()
    .map(|stream| {
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                println!("{line}");
                seen.push(line);
            }
            seen
        })
    })
    .collect();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = inner.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > INNER_LIMIT {
            let _ = inner.kill();
            let _ = inner.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // First what may still run in the namespaces (after a stopped run), then the output.
    drop(namespaces);
    let lines: Vec<String> = relays.into_iter().flat_map(|r| r.join().unwrap_or_default()).collect();
    match status {
        Some(status) if status.success() => {
            // The inner run passes only if it ran this one test (a renamed test would run none).
            assert!(
                lines.iter().any(|l| l.starts_with("test result: ok. 1 passed")),
                "the run inside {} did not run {test}:\n{}",
                layout.client,
                lines.join("\n")
            );
            None
        }
        Some(status) => panic!("{test} failed inside its network namespace ({status}); its output is above"),
        None => panic!("{test} did not finish within {INNER_LIMIT:?} inside its network namespace"),
    }
}

/// The simulated cluster and Prometheus in the upstream namespace, percolator in the client
/// namespace (this process's): each process killed on drop.
pub(crate) struct NetEnv {
    pub dir: PathBuf,
    pub layout: Layout,
    /// percolator's base URL (`https://127.0.0.1:P`, in the client namespace).
    pub url: String,
    /// The simulator's control and metrics base URL (never dropped by a fault).
    pub control: String,
    /// A client presenting the front-proxy certificate, as kube-apiserver's aggregator does:
    /// identities are set per request ([`NetEnv::get_as`]).
    pub front: reqwest::Client,
    _sim: tokio::process::Child,
    _prometheus: tokio::process::Child,
    _percolator: tokio::process::Child,
}

/// One answer of percolator, timed.
#[derive(Debug, Clone)]
pub(crate) struct Observed {
    pub code: u16,
    pub latency: Duration,
    pub warnings: Vec<String>,
    pub retry_after: Option<String>,
    pub body: Value,
}

impl Observed {
    /// The list's items (none when the answer is not a list).
    pub(crate) fn items(&self) -> &[Value] {
        self.body["items"].as_array().map_or(&[], Vec::as_slice)
    }

    /// Whether a `Warning` header contains `needle`.
    pub(crate) fn warned(&self, needle: &str) -> bool {
        self.warnings.iter().any(|w| w.contains(needle))
    }
}

/// A user and its groups, sent as `X-Remote-User` / `X-Remote-Group` over the front-proxy
/// certificate.
pub(crate) type Who<'a> = (&'a str, &'a [&'a str]);

/// Never reviewed: `--authorization-always-allow-groups` holds `system:masters`, so reading
/// `/metrics` as it needs no kube-apiserver, whatever the fault.
pub(crate) const ADMIN: Who<'static> = ("netns-admin", &["system:masters"]);

impl NetEnv {
    /// Starts the simulator (3 nodes of 6 pods, kubelet housekeeping 2 s) and Prometheus (15
    /// minutes of backfilled history, scraping every 2 s) in the upstream namespace, then
    /// percolator here with `extra` flags; returns once `/readyz` passes.
    pub(crate) async fn start(name: &str, layout: Layout, extra: &[&str]) -> NetEnv {
        apiserver::install_crypto_provider();
        let dir = super::mk_dir(name);
        let mut sim = layout.upstream_command(percolator_sim::binary().unwrap());
        sim.arg("--state-dir")
            .arg(dir.join("sim"))
            .args(["--seed", "7", "--nodes", &NODES.to_string(), "--pods-per-node", "6"])
            .args(["--namespaces", "shop,api,default", "--housekeeping", super::HOUSEKEEPING])
            .args(["--bind-address", &UPSTREAM_IP.to_string(), "--node-ip-start", &NODE_IP_START.to_string()])
            .args(["--api-port", &API_PORT.to_string(), "--metrics-port", &CONTROL_PORT.to_string()])
            .args(["--kubelet-port", &KUBELET_PORT.to_string()])
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.join("sim.log")).unwrap());
        let (sim, ready) = super::mk_sim(sim).await;
        let control = ready["metrics"].as_str().unwrap().to_owned();
        assert_eq!(control, format!("http://{UPSTREAM_IP}:{CONTROL_PORT}"));
        let prometheus = mk_prometheus(&layout, &dir.join("prometheus"), &control).await;

        let log = dir.join("percolator.log");
        let prometheus_url = format!("http://{UPSTREAM_IP}:{PROMETHEUS_PORT}");
        let kubeconfig = dir.join("sim/kubeconfig");
        let mut percolator = super::percolator_command(0, &kubeconfig, &prometheus_url);
        percolator.arg("--cert-dir").arg(dir.join("certs")).args(["-v", "4"]).args(extra);
        let started = super::mk_percolator(percolator, "percolator", &log).await;
        let url = started.url();
        let percolator = started.child;
        let state = dir.join("sim");
        let mut pem = std::fs::read(state.join("front-proxy-client.crt")).unwrap();
        pem.extend(std::fs::read(state.join("front-proxy-client.key")).unwrap());
        let ca = std::fs::read(dir.join("certs/apiserver.crt")).unwrap();
        let front = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
            .identity(reqwest::Identity::from_pem(&pem).unwrap())
            // Far above every bound asserted: a hang fails the test instead of stalling it.
            .timeout(Duration::from_secs(45))
            .build()
            .unwrap();
        let env = NetEnv {
            dir,
            layout,
            url,
            control,
            front,
            _sim: sim,
            _prometheus: prometheus,
            _percolator: percolator,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while env.get_as(ADMIN, "/readyz").await.code != 200 {
            assert!(Instant::now() < deadline, "percolator never became ready; see {}", log.display());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        env
    }

    /// GET `path` of percolator as `who`, timed.
    pub(crate) async fn get_as(&self, who: Who<'_>, path: &str) -> Observed {
        mk_get(&self.front, &self.url, who, path).await
    }

    /// percolator's `/metrics`, read as [`ADMIN`].
    pub(crate) async fn metrics_text(&self) -> String {
        let got = self.get_as(ADMIN, "/metrics").await;
        assert_eq!(got.code, 200, "/metrics: {}", got.body);
        got.body.as_str().unwrap().to_owned()
    }

    /// The simulator's call counters (`/sim/stats`).
    pub(crate) async fn sim_stats(&self) -> Value {
        reqwest::get(format!("{}/sim/stats", self.control)).await.unwrap().json().await.unwrap()
    }

    /// Replaces one running pod (`POST /sim/churn`): (namespace, deleted name, created name).
    pub(crate) async fn churn(&self) -> (String, String, String) {
        let url = format!("{}/sim/churn", self.control);
        let churn = super::mk_post_json(&reqwest::Client::new(), &url, "").await;
        let s = |v: &Value| v.as_str().unwrap().to_owned();
        (s(&churn["created"]["namespace"]), s(&churn["deleted"]["name"]), s(&churn["created"]["name"]))
    }

    /// Lines of Prometheus' query log so far: one per PromQL query it ran.
    pub(crate) fn prometheus_queries(&self) -> usize {
        std::fs::read_to_string(self.dir.join("prometheus/query.log")).map_or(0, |t| t.lines().count())
    }

    /// Sends, every `every` and without waiting for the answers (so that answers held up
    /// would pile up as requests in flight), a GET as `who` of each of `paths` in turn, until
    /// [`Load::stop`].
    pub(crate) fn mk_load(&self, who: Who<'static>, paths: &[&'static str], every: Duration) -> Load {
        let records = Arc::new(Mutex::new(Vec::new()));
        let (front, url, into, paths) =
            (self.front.clone(), self.url.clone(), records.clone(), paths.to_vec());
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let mut sent = tokio::task::JoinSet::new();
            let mut ticker = tokio::time::interval(every);
            for path in paths.iter().copied().cycle() {
                tokio::select! {
                    _ = ticker.tick() => {}
                    _ = stopped.changed() => break,
                }
                let (front, url, into) = (front.clone(), url.clone(), into.clone());
                sent.spawn(async move {
                    let at = Instant::now();
                    // No answer at all is recorded as code 0, for the test to report.
                    let got = mk_try_get(&front, &url, who, path).await.unwrap_or_else(|e| Observed {
                        code: 0,
                        latency: at.elapsed(),
                        warnings: Vec::new(),
                        retry_after: None,
                        body: Value::String(e),
                    });
                    into.lock().await.push(Answer { at, path, got });
                });
                while sent.try_join_next().is_some() {}
            }
            // The answers still due (the client's timeout bounds the wait).
            while sent.join_next().await.is_some() {}
        });
        Load { records, task, stop }
    }

    /// Samples percolator's `/metrics` (as [`ADMIN`]) every `every` until dropped.
    pub(crate) fn mk_sampler(&self, every: Duration) -> Sampler {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let (front, url, into) = (self.front.clone(), format!("{}/metrics", self.url), samples.clone());
        let task = tokio::spawn(async move {
            loop {
                let started = Instant::now();
                let request =
                    front.get(&url).header("X-Remote-User", ADMIN.0).header("X-Remote-Group", ADMIN.1[0]);
                let sample = match request.send().await {
                    Ok(response) if response.status() == 200 => {
                        let text = response.text().await.unwrap_or_default();
                        Some(Sample {
                            at: started,
                            tasks: gauge(&text, "percolator_tokio_tasks_alive"),
                            fds: gauge(&text, "process_open_fds"),
                            in_flight: gauge(&text, "percolator_http_requests_in_flight"),
                        })
                    }
                    _ => None,
                };
                into.lock().await.push(sample.unwrap_or(Sample {
                    at: started,
                    tasks: -1.0,
                    fds: -1.0,
                    in_flight: -1.0,
                }));
                tokio::time::sleep(every.saturating_sub(started.elapsed())).await;
            }
        });
        Sampler { samples, task }
    }
}

/// GET `url` + `path` with `client` (the front-proxy certificate) as `who`, timed; panics
/// when no answer comes.
async fn mk_get(client: &reqwest::Client, url: &str, who: Who<'_>, path: &str) -> Observed {
    mk_try_get(client, url, who, path).await.unwrap_or_else(|e| panic!("{e}"))
}

/// [`mk_get`], or why no answer came.
async fn mk_try_get(
    client: &reqwest::Client,
    url: &str,
    who: Who<'_>,
    path: &str,
) -> Result<Observed, String> {
    let (user, groups) = who;
    let mut request = client.get(format!("{url}{path}")).header("X-Remote-User", user);
    for group in groups {
        request = request.header("X-Remote-Group", *group);
    }
    let started = Instant::now();
    let response = request.send().await.map_err(|e| format!("GET {path} as {user}: {e}"))?;
    let code = response.status().as_u16();
    let retry_after = response.headers().get("retry-after").map(|v| v.to_str().unwrap_or("?").to_owned());
    let warnings =
        response.headers().get_all("warning").iter().map(|w| w.to_str().unwrap_or("?").to_owned()).collect();
    let text = response.text().await.map_err(|e| format!("GET {path} as {user}: body: {e}"))?;
    let latency = started.elapsed();
    Ok(Observed {
        code,
        latency,
        warnings,
        retry_after,
        body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
    })
}

/// One answer to the [`Load`]: when its request was sent, to which path, what came back.
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    pub at: Instant,
    pub path: &'static str,
    pub got: Observed,
}

/// Requests sent at a steady pace in the background ([`NetEnv::mk_load`]).
pub(crate) struct Load {
    records: Arc<Mutex<Vec<Answer>>>,
    task: tokio::task::JoinHandle<()>,
    stop: tokio::sync::watch::Sender<bool>,
}

impl Load {
    /// Stops sending, waits for the answers still due, and returns every answer, in the
    /// order their requests were sent.
    pub(crate) async fn stop(self) -> Vec<Answer> {
        let _ = self.stop.send(true);
        if let Err(e) = self.task.await {
            std::panic::resume_unwind(e.into_panic());
        }
        let mut answers = self.records.lock().await.clone();
        answers.sort_by_key(|a| a.at);
        answers
    }
}

/// The value of the series `name` (with its labels, as written) in a Prometheus text
/// exposition; 0 when it is absent (a counter not yet incremented).
pub(crate) fn series(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The value of the unlabelled series `name` in a Prometheus text exposition.
fn gauge(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

/// One reading of percolator's own gauges (-1: `/metrics` did not answer 200).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample {
    pub at: Instant,
    /// `percolator_tokio_tasks_alive`.
    pub tasks: f64,
    /// `process_open_fds`.
    pub fds: f64,
    /// `percolator_http_requests_in_flight` (the `/metrics` request itself included).
    pub in_flight: f64,
}

/// Readings of percolator's gauges, taken in the background.
pub(crate) struct Sampler {
    samples: Arc<Mutex<Vec<Sample>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    /// The readings taken from `from` to `to`; panics if `/metrics` failed in one, or if
    /// there are none.
    pub(crate) async fn between(&self, from: Instant, to: Instant) -> Vec<Sample> {
        let taken: Vec<Sample> =
            self.samples.lock().await.iter().filter(|s| s.at >= from && s.at <= to).copied().collect();
        assert!(!taken.is_empty(), "no /metrics sample in a window of {:?}", to - from);
        for s in &taken {
            assert!(s.tasks >= 0.0, "/metrics did not answer at {:?} into the window", s.at - from);
        }
        taken
    }

    /// The highest (tasks, descriptors, requests in flight) from `from` to `to`.
    pub(crate) async fn peak(&self, from: Instant, to: Instant) -> (f64, f64, f64) {
        self.between(from, to).await.iter().fold((0.0, 0.0, 0.0), |(t, f, i), s| {
            (f64::max(t, s.tasks), f64::max(f, s.fds), f64::max(i, s.in_flight))
        })
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Backfills 15 minutes of the simulator's history and starts Prometheus in the upstream
/// namespace, scraping the simulator there; returns once the scrape is up.
async fn mk_prometheus(layout: &Layout, dir: &Path, control: &str) -> tokio::process::Child {
    std::fs::create_dir_all(dir.join("data")).unwrap();
    let target = control.trim_start_matches("http://");
    let history = super::devenv::sim_history(control, "sim-apps", target, Duration::from_secs(900), SCRAPE)
        .await
        .unwrap();
    std::fs::write(dir.join("history.om"), history).unwrap();
    let promtool = std::env::var("PROMTOOL_BIN").unwrap_or_else(|_| "promtool".into());
    let backfill = tokio::process::Command::new(&promtool)
        .args(["tsdb", "create-blocks-from", "openmetrics"])
        .arg(dir.join("history.om"))
        .arg(dir.join("data"))
        .output()
        .await
        .unwrap_or_else(|e| panic!("{promtool}: {e} (install Debian's prometheus package)"));
    assert!(backfill.status.success(), "promtool: {}", String::from_utf8_lossy(&backfill.stderr));
    let config = format!(
        "global:\n  scrape_interval: 2s\n  evaluation_interval: 2s\n  query_log_file: {}\n\
         scrape_configs:\n  - job_name: sim-apps\n    honor_labels: true\n    static_configs:\n\
         \x20     - targets: ['{target}']\n",
        dir.join("query.log").display()
    );
    std::fs::write(dir.join("prometheus.yml"), config).unwrap();
    let prometheus = std::env::var("PROMETHEUS_BIN").unwrap_or_else(|_| "prometheus".into());
    let mut command = layout.upstream_command(&prometheus);
    command
        .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
        .arg(format!("--web.listen-address={UPSTREAM_IP}:{PROMETHEUS_PORT}"))
        .args(["--storage.tsdb.retention.time=1d", "--log.level=warn"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap());
    let child = command.spawn().unwrap_or_else(|e| panic!("{prometheus} in the upstream namespace: {e}"));
    let up =
        format!("http://{UPSTREAM_IP}:{PROMETHEUS_PORT}/api/v1/query?query=up%7Bjob%3D%22sim-apps%22%7D");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(response) = reqwest::get(&up).await
            && let Ok(v) = response.json::<Value>().await
            && v["data"]["result"][0]["value"][1] == "1"
        {
            return child;
        }
        assert!(Instant::now() < deadline, "Prometheus never scraped the simulator; see {}", dir.display());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
