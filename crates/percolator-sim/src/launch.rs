//! Starting percolator and the simulator as child processes, for the end-to-end tests, the
//! benchmark and the soak alike: the flags every one of them gives percolator
//! ([`percolator_command`]), and the wait for the JSON line a child prints once it is ready
//! ([`start`] for percolator's `serving` line, [`start_sim`] for the simulator's `ready` line),
//! then [`wait_ready`] for `/readyz`.
//!
//! A child's output is read on after its ready line, so that it never blocks on a full pipe;
//! every line, before and after, goes to the caller's sink ([`log_file`], or a buffer).

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};

/// A child that did not report ready: it could not start, its output ended, or the time ran
/// out; with everything it printed until then.
#[derive(Debug, thiserror::Error)]
#[error("{what} {reason}; output so far:\n{output}")]
pub struct NotReady {
    /// The child, as the caller named it.
    pub what: String,
    /// What happened: `did not start: …`, `exited`, `did not report ready within …`.
    pub reason: String,
    /// Its lines until then.
    pub output: String,
}

/// A command running percolator's binary `bin` on `127.0.0.1:port` (0 for a free port) against
/// the cluster of `kubeconfig` and the Prometheus at `prometheus_url`, reaching kubelets at
/// their InternalIP and status port (a simulated node's Hostname does not resolve); its stdout
/// discarded, its stderr (the JSON log) piped for [`start`], killed on drop. The caller adds
/// the rest of the flags.
pub fn percolator_command(bin: &Path, port: u16, kubeconfig: &Path, prometheus_url: &str) -> Command {
    let mut command = Command::new(bin);
    command
        .args(["--secure-port", &port.to_string(), "--bind-address", "127.0.0.1"])
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--prometheus-url", prometheus_url])
        .args(["--kubelet-preferred-address-types", "InternalIP", "--kubelet-use-node-status-port"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

/// A percolator that has printed its `serving` line.
#[derive(Debug)]
pub struct Started {
    /// The process (killed when dropped, if its command says so).
    pub child: Child,
    /// Its pid.
    pub pid: u32,
    /// The address it serves on (`127.0.0.1:port`).
    pub address: String,
}

impl Started {
    /// `https://` and [`Started::address`].
    pub fn url(&self) -> String {
        format!("https://{}", self.address)
    }
}

/// Spawns `command` (percolator, its stderr piped: [`percolator_command`]) and waits, for
/// `timeout` at most, for its `serving` log line; every stderr line goes to `sink`.
pub async fn start(
    mut command: Command,
    what: &str,
    timeout: Duration,
    sink: impl FnMut(&str) + Send + 'static,
) -> Result<Started, NotReady> {
    let mut child = command.spawn().map_err(|e| NotReady {
        what: what.to_owned(),
        reason: format!("did not start: {e}"),
        output: String::new(),
    })?;
    let pid = child.id().unwrap_or(0);
    let stderr = child.stderr.take().ok_or_else(|| NotReady {
        what: what.to_owned(),
        reason: "has no piped stderr to read its serving line from".to_owned(),
        output: String::new(),
    })?;
    let serving = |v: &Value| (v["fields"]["message"] == "serving").then(|| v["fields"]["address"].clone());
    let address = wait_for_line(stderr, what, timeout, sink, serving).await?;
    let address = address.as_str().unwrap_or_default().to_owned();
    Ok(Started { child, pid, address })
}

/// Spawns `command` (the simulator: [`crate::command`]) and waits, for `timeout` at most, for
/// the `ready` line on its stdout; the child and that line (its `api` and `metrics` URLs).
pub async fn start_sim(mut command: Command, timeout: Duration) -> Result<(Child, Value), NotReady> {
    let mut child = command.spawn().map_err(|e| NotReady {
        what: "percolator-sim".to_owned(),
        reason: format!("did not start: {e}"),
        output: String::new(),
    })?;
    let stdout = child.stdout.take().ok_or_else(|| NotReady {
        what: "percolator-sim".to_owned(),
        reason: "has no piped stdout to read its ready line from".to_owned(),
        output: String::new(),
    })?;
    let ready = |v: &Value| (v["event"] == "ready").then(|| v.clone());
    let line = wait_for_line(stdout, "percolator-sim", timeout, |_| {}, ready).await?;
    Ok((child, line))
}

/// Reads `stream` line by line until `pick` accepts a line parsed as JSON, within `timeout`;
/// what it picked. Every line goes to `sink`, and the stream is read on after (in a task of
/// its own) so that the child never blocks writing.
pub async fn wait_for_line<R>(
    stream: R,
    what: &str,
    timeout: Duration,
    mut sink: impl FnMut(&str) + Send + 'static,
    pick: impl Fn(&Value) -> Option<Value>,
) -> Result<Value, NotReady>
where
    R: AsyncRead + Unpin + Send + 'static,
{
    let mut lines = BufReader::new(stream).lines();
    let mut seen = Vec::new();
    let found = tokio::time::timeout(timeout, async {
        while let Ok(Some(line)) = lines.next_line().await {
            sink(&line);
            let picked = serde_json::from_str::<Value>(&line).ok().and_then(|v| pick(&v));
            seen.push(line);
            if picked.is_some() {
                return picked;
            }
        }
        None
    })
    .await;
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            sink(&line);
        }
    });
    let reason = match found {
        Ok(Some(value)) => return Ok(value),
        Ok(None) => "exited".to_owned(),
        Err(_) => format!("did not report ready within {timeout:?}"),
    };
    Err(NotReady { what: what.to_owned(), reason, output: seen.join("\n") })
}

/// A sink appending every line to the file `path` (created if needed).
pub fn log_file(path: &Path) -> impl FnMut(&str) + Send + 'static {
    use std::io::Write as _;
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path).ok();
    move |line| {
        if let Some(file) = file.as_mut() {
            let _ = writeln!(file, "{line}");
        }
    }
}

/// Asks `url`/readyz with `client` every 100 ms until it answers 2xx; false when `timeout`
/// passes first.
pub async fn wait_ready(client: &reqwest::Client, url: &str, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(r) = client.get(format!("{url}/readyz")).send().await
            && r.status().is_success()
        {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A shell command printing `script`'s lines on its stdout, as a child does.
    fn mk_child(script: &str) -> Child {
        Command::new("sh").args(["-c", script]).stdout(Stdio::piped()).kill_on_drop(true).spawn().unwrap()
    }

    #[tokio::test]
    async fn the_picked_line_is_returned_and_every_line_reaches_the_sink() {
        let mut child = mk_child(
            r#"echo starting; echo '{"event":"ready","api":"https://a"}'; echo after; sleep 0.2; echo later"#,
        );
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        let picked = wait_for_line(
            child.stdout.take().unwrap(),
            "child",
            Duration::from_secs(10),
            move |l| sink.lock().unwrap().push(l.to_owned()),
            |v| (v["event"] == "ready").then(|| v["api"].clone()),
        )
        .await
        .unwrap();
        assert_eq!(picked, "https://a");
        child.wait().await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let lines = lines.lock().unwrap().clone();
        assert_eq!(lines, ["starting", r#"{"event":"ready","api":"https://a"}"#, "after", "later"]);
    }

    #[tokio::test]
    async fn an_exit_or_a_timeout_says_what_was_printed() {
        let mut child = mk_child("echo one; echo two");
        let exited =
            wait_for_line(child.stdout.take().unwrap(), "quitter", Duration::from_secs(10), |_| {}, |_| None)
                .await
                .unwrap_err();
        assert_eq!(exited.to_string(), "quitter exited; output so far:\none\ntwo");
        let mut child = mk_child("echo waiting; sleep 30");
        let slow = wait_for_line(
            child.stdout.take().unwrap(),
            "sleeper",
            Duration::from_millis(300),
            |_| {},
            |_| None,
        )
        .await
        .unwrap_err();
        assert_eq!(slow.to_string(), "sleeper did not report ready within 300ms; output so far:\nwaiting");
    }
}
