//! The simulated cluster and the machinery of percolator's demo, tests and benchmarks, none of
//! it in the `percolator` library or binary:
//!
//! - [`sim`]: a simulated Kubernetes cluster on loopback (API with watches, TokenReview and
//!   SubjectAccessReview, an aggregator in front of percolator, kubelets, cAdvisor, apps);
//! - [`demo`]: `percolator-sim demo`, the simulator, a real Prometheus and percolator together;
//! - [`devenv`]: the local Prometheus (or VictoriaMetrics) and the fault proxy, which the tests
//!   and benchmarks start;
//! - [`launch`]: starting percolator and the simulator and waiting until they are ready (the
//!   tests, the benchmark and the soak);
//! - [`procfs`]: what a process holds, read from `/proc/<pid>` (memory, CPU time, descriptors);
//! - [`pki`]: the certificates the simulator, its TLS fronts and the soak mint (one CA type);
//! - [`securefront`]: the TLS + token + tenant front the end-to-end tests put before an engine;
//! - [`balancer`]: a front balancing HTTP/2 streams over percolator replicas by readiness, as
//!   kube-aggregator reaches a Service (the rolling-restart tests);
//! - [`soak`]: the soak run (`percolator-sim soak`, `scripts/soak.sh`, `tests/soak.rs`): an
//!   hour of churn, load and faults, and whether anything grows.
//!
//! These modules are public because they are namespaces: the binary's commands
//! (`demo::run`, `sim::run`, `soak::…`) and the tests' harness (`devenv::…`, `securefront::…`,
//! `balancer::…`) are named through them. The simulator's parts inside `sim` are private.

pub mod balancer;
pub mod demo;
pub mod devenv;
#[cfg(test)]
mod devenv_tests;
pub mod launch;
pub mod pki;
pub mod procfs;
pub mod securefront;
pub mod sim;
pub mod soak;

/// The `percolator-sim` binary of this build, for the tests and benchmarks of other packages
/// (Cargo gives `CARGO_BIN_EXE_<name>` only for a package's own binaries): it sits next to the
/// `deps/` directory of the running test or bench executable, in `target/<profile>/`. The
/// workspace's test command builds it (this package has integration tests, so
/// `cargo test --workspace` builds its binary); `scripts/bench.sh` builds the release one.
pub fn binary() -> std::io::Result<std::path::PathBuf> {
    let exe = std::env::current_exe()?;
    let profile_dir =
        exe.parent().and_then(|deps| if deps.ends_with("deps") { deps.parent() } else { Some(deps) });
    let path = profile_dir.map(|dir| dir.join(format!("percolator-sim{}", std::env::consts::EXE_SUFFIX)));
    match path {
        Some(path) if path.is_file() => Ok(path),
        _ => Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!(
                "no percolator-sim binary beside {}: build it first (`cargo build -p percolator-sim`, \
                 `--release` for benchmarks), or run the workspace's tests (`scripts/test.sh`)",
                exe.display()
            ),
        )),
    }
}

/// A command starting [`binary`] with its state in `dir/sim` (`--state-dir`), its stdout piped
/// (for the ready line) and its stderr in `dir/sim.log`, killed on drop; the caller adds the
/// cluster's flags and spawns it.
pub fn command(dir: &std::path::Path) -> std::io::Result<tokio::process::Command> {
    let mut command = tokio::process::Command::new(binary()?);
    command
        .arg("--state-dir")
        .arg(dir.join("sim"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(dir.join("sim.log"))?)
        .kill_on_drop(true);
    Ok(command)
}
