//! The local demo as users start it (`percolator-sim demo`): every command of the block it
//! prints is run exactly as printed (through bash, after its `export KUBECONFIG=…`) with the
//! real kubectl, so the printed commands cannot go stale; a few answers are compared with the
//! simulator's ground truth, and the terminal must hold the instructions only (no log lines).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead as _, BufReader, Read as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

/// The demo prints its block once the data is there (two kubelet samples, ~10-20 s).
const READY_TIMEOUT: Duration = Duration::from_secs(150);

/// The last line of what the demo prints.
const LAST_LINE: &str = "Ctrl-C stops everything.";

fn kubectl_bin() -> String {
    std::env::var("KUBECTL").unwrap_or_else(|_| "/usr/bin/kubectl".to_string())
}

fn mk_temp_dir() -> PathBuf {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    let dir = std::env::temp_dir().join(format!("percolator-e2e-demo-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The demo, stopped (SIGINT, then SIGKILL) when dropped.
struct Demo {
    child: Child,
    stdout: mpsc::Receiver<String>,
    stderr: std::thread::JoinHandle<String>,
}

impl Demo {
    fn start(dir: &Path) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_percolator-sim"))
            .args(["demo", "--port", "0", "--api-port", "0", "--nodes", "2", "--pods-per-node", "3", "--dir"])
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting percolator-sim demo");
        let (tx, stdout) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut err = child.stderr.take().unwrap();
        let stderr = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = err.read_to_string(&mut text);
            text
        });
        Self { child, stdout, stderr }
    }

    /// Everything printed on stdout up to the last line of the block.
    fn printed(&self) -> Vec<String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut lines = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stdout.recv_timeout(left) {
                Ok(line) => {
                    let last = line.contains(LAST_LINE);
                    lines.push(line);
                    if last {
                        return lines;
                    }
                }
                Err(e) => panic!("the demo printed no complete block ({e}); so far: {lines:#?}"),
            }
        }
    }

    /// Stops the demo with SIGINT (Ctrl-C); returns its stderr.
    fn stop(mut self) -> String {
        let _ = Command::new("kill").args(["-INT", &self.child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "the demo did not stop on SIGINT");
            std::thread::sleep(Duration::from_millis(100));
        }
        let stderr = std::mem::replace(&mut self.stderr, std::thread::spawn(String::new));
        stderr.join().unwrap()
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs `command` as a user would paste it after `export`, with its own kubectl cache;
/// returns its exit success and combined output.
fn run(export: &str, command: &str, home: &Path) -> (bool, String) {
    let script = format!("{export}\n{command}");
    let output = Command::new("bash")
        .args(["-c", &format!("exec 2>&1\n{script}")])
        .env("HOME", home)
        // kubectl ≥ 1.26 takes its default --cache-dir from KUBECACHEDIR.
        .env("KUBECACHEDIR", home.join("kube-cache"))
        .env("PATH", path_with_kubectl())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (output.status.success(), String::from_utf8_lossy(&output.stdout).into_owned())
}

/// `PATH` with the directory of [`kubectl_bin`] first, so `kubectl` in the printed commands
/// is the one the tests use.
fn path_with_kubectl() -> String {
    let kubectl = PathBuf::from(kubectl_bin());
    let dir = kubectl.parent().map(Path::to_path_buf).unwrap_or_default();
    format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_printed_command_runs_as_printed() {
    apiserver::install_crypto_provider();
    let started = Instant::now();
    let temp = mk_temp_dir();
    let dir = temp.join("demo");
    let demo = Demo::start(&dir);
    let printed = tokio::task::block_in_place(|| demo.printed());
    eprintln!("the demo printed its block after {:.1}s", started.elapsed().as_secs_f64());

    let commands: Vec<&str> = printed
        .iter()
        .filter_map(|l| l.strip_prefix("  "))
        .filter(|l| l.starts_with("export ") || l.starts_with("kubectl "))
        .collect();
    let export = *commands.first().expect("no commands printed");
    assert!(export.starts_with("export KUBECONFIG="), "{export}");
    assert!(commands.contains(&"kubectl top nodes"), "{commands:#?}");
    assert!(commands.len() >= 10, "{commands:#?}");

    let sim: Value = serde_json::from_slice(&std::fs::read(dir.join("sim/sim.json")).unwrap()).unwrap();
    let truth: Value = reqwest::get(format!("{}/sim/truth", sim["metrics"].as_str().unwrap()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();

    let mut answers = Vec::new();
    for command in &commands[1..] {
        let (ok, output) = tokio::task::block_in_place(|| run(export, command, &temp));
        eprintln!("$ {command}\n{output}");
        assert!(ok, "{command} failed:\n{output}");
        assert!(!output.trim().is_empty(), "{command} printed nothing");
        if command.ends_with("|| true") {
            assert!(output.contains("(Forbidden)"), "{command} was not refused:\n{output}");
        } else {
            assert!(!output.contains("rror"), "{command}:\n{output}");
        }
        answers.push((*command, output));
    }
    let answer = |prefix: &str| {
        answers
            .iter()
            .find(|(c, _)| c.starts_with(prefix))
            .map(|(_, o)| o.as_str())
            .unwrap_or_else(|| panic!("no printed command starts with {prefix}"))
    };

    // kubectl top pods -A lists every running pod of shop.
    let top = answer("kubectl top pods -A");
    for pod in truth["pods"].as_array().unwrap() {
        if pod["namespace"] == "shop" && pod["phase"] == "Running" {
            let name = pod["name"].as_str().unwrap();
            assert!(top.lines().any(|l| l.split_whitespace().nth(1) == Some(name)), "{name} missing:\n{top}");
        }
    }
    // kubectl top nodes: every node, through the simulated kube-apiserver's aggregation.
    let nodes = answer("kubectl top nodes");
    for node in truth["nodes"].as_array().unwrap() {
        let name = node["name"].as_str().unwrap();
        assert!(nodes.lines().any(|l| l.starts_with(&format!("{name} "))), "{name} missing:\n{nodes}");
    }
    let custom: Value =
        serde_json::from_str(answer("kubectl get --raw /apis/custom.metrics.k8s.io")).unwrap();
    assert_eq!(custom["items"].as_array().unwrap().len(), 1, "{custom}");
    assert_eq!(custom["items"][0]["describedObject"]["kind"], "Deployment");
    let external: Value =
        serde_json::from_str(answer("kubectl get --raw /apis/external.metrics.k8s.io")).unwrap();
    assert!(!external["items"].as_array().unwrap().is_empty(), "{external}");
    assert!(answer("kubectl explain").contains("PodMetricsSummary"));

    let stderr = tokio::task::block_in_place(|| demo.stop());
    let terminal = format!("{}\n{stderr}", printed.join("\n"));
    for marker in [" INFO ", " DEBUG ", " TRACE ", "\u{1b}["] {
        assert!(!terminal.contains(marker), "a log line reached the terminal ({marker:?}):\n{terminal}");
    }
    assert!(std::fs::metadata(dir.join("percolator.log")).unwrap().len() > 0, "percolator.log is empty");
    assert!(std::fs::metadata(dir.join("sim.log")).unwrap().len() > 0, "sim.log is empty");
    let _ = std::fs::remove_dir_all(&temp);
    eprintln!("done in {:.1}s", started.elapsed().as_secs_f64());
}
