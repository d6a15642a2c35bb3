//! The process metrics every OpenMetrics client library exports, under the names client_golang
//! gives them (metrics-server's and kube-apiserver's): `process_resident_memory_bytes`,
//! `process_open_fds`, `process_cpu_seconds_total`, … Read from `/proc/self` when `/metrics`
//! is scraped, so that the alerts and dashboards written for any Go component watch this one
//! too; on other systems nothing is exported. Beside them, [`memory_limit`]: the memory limit
//! of the cgroup the process runs in (a container's `resources.limits.memory`), which a server
//! may export under its own name to alert resident memory against.

use openmetrics::collector::Collector;
use openmetrics::encoding::{DescriptorEncoder, EncodeMetric};
#[cfg(target_os = "linux")]
use openmetrics::metrics::counter::ConstCounter;
#[cfg(target_os = "linux")]
use openmetrics::metrics::gauge::ConstGauge;

/// The `process_*` collector (register it on an unprefixed registry).
#[derive(Debug, Default)]
pub(crate) struct ProcessCollector;

/// One reading of `/proc/self`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Reading {
    pub cpu_seconds: f64,
    pub open_fds: u64,
    /// `None` when unlimited.
    pub max_fds: Option<u64>,
    pub virtual_bytes: u64,
    pub resident_bytes: u64,
    pub start_time_seconds: f64,
    pub threads: u64,
    /// The memory limit of the process' cgroup; `None` when unlimited or unknown.
    pub memory_limit: Option<u64>,
}

impl ProcessCollector {
    /// Reads `/proc/self`; `None` where there is none (or it cannot be read, which a scrape
    /// survives: the series are then absent, as client_golang leaves them).
    #[cfg(target_os = "linux")]
    pub(crate) fn read() -> Option<Reading> {
        let me = procfs::process::Process::myself().ok()?;
        let stat = me.stat().ok()?;
        let ticks = procfs::ticks_per_second() as f64;
        let boot = procfs::boot_time_secs().ok()? as f64;
        let max_fds = match me.limits().ok()?.max_open_files.soft_limit {
            procfs::process::LimitValue::Unlimited => None,
            procfs::process::LimitValue::Value(n) => Some(n),
        };
        Some(Reading {
            cpu_seconds: (stat.utime + stat.stime) as f64 / ticks,
            open_fds: me.fd_count().ok()? as u64,
            max_fds,
            virtual_bytes: stat.vsize,
            resident_bytes: stat.rss * procfs::page_size(),
            start_time_seconds: boot + stat.starttime as f64 / ticks,
            threads: u64::try_from(stat.num_threads).unwrap_or(0),
            memory_limit: me
                .cgroups()
                .ok()
                .and_then(|groups| cgroup_memory_limit(std::path::Path::new(CGROUP_ROOT), &groups.0)),
        })
    }

    #[cfg(not(target_os = "linux"))]
    pub(crate) fn read() -> Option<Reading> {
        None
    }
}

/// The memory limit of the cgroup this process runs in, in bytes, read now; `None` when
/// unlimited, unknown, or not on Linux.
pub fn memory_limit() -> Option<u64> {
    ProcessCollector::read().and_then(|r| r.memory_limit)
}

/// `<namespace>_memory_limit_bytes`: the memory limit of the cgroup the process runs in (a
/// container's `resources.limits.memory`), which resident memory is alerted against; read at
/// every scrape, absent when unlimited. The server words its help (it names the server).
#[derive(Debug)]
pub struct MemoryLimit {
    /// The family's help text.
    pub help: &'static str,
}

impl Collector for MemoryLimit {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let Some(limit) = memory_limit() else { return Ok(()) };
        let metric = openmetrics::metrics::gauge::ConstGauge::new(i64::try_from(limit).unwrap_or(i64::MAX));
        metric.encode(encoder.encode_descriptor(
            "memory_limit_bytes",
            self.help,
            None,
            metric.metric_type(),
        )?)
    }
}

/// Turns transparent huge pages off for this process (`prctl(PR_SET_THP_DISABLE)`), unless
/// `MIMALLOC_ALLOW_THP` is set (then mimalloc's own option decides).
///
/// An allocator such as mimalloc asks for huge pages on its arena (`MADV_HUGEPAGE`), and
/// Linux' khugepaged, scanning a few MiB every 10 s, collapses any 2 MiB range of it that has
/// pages in use into one huge page, faulting in the rest: pages the allocator had freed and
/// given back, which it does not give back again, since for it they are gone. Resident memory
/// then rises with each collapse (12 MiB of huge pages at once, the floor higher from then on)
/// and nowhere else. A heap of tens of MiB gains nothing from them.
pub fn keep_the_heap_in_small_pages() {
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_some() {
        return;
    }
    #[cfg(target_os = "linux")]
    if let Err(error) = rustix::thread::disable_transparent_huge_pages(true) {
        tracing::warn!(
            %error,
            "could not turn transparent huge pages off (prctl PR_SET_THP_DISABLE): resident memory may grow as the kernel collapses the heap into huge pages"
        );
    }
}

/// Where the cgroup hierarchies are mounted.
#[cfg(target_os = "linux")]
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// At or above this a limit is "unlimited": cgroup v1 writes `PAGE_COUNTER_MAX` pages (about
/// 2⁶³ bytes) where v2 writes `max`.
#[cfg(target_os = "linux")]
const UNLIMITED: u64 = 1 << 62;

/// The memory limit that applies to a process in `groups` (`/proc/self/cgroup`: hierarchy,
/// controllers, path) with the hierarchies mounted under `root`: the lowest limit of its cgroup
/// and of the ancestors visible, as the kernel enforces each of them (Kubernetes limits the
/// container, and the Pod when every container has a limit). The v2 hierarchy (`0::/path`)
/// is read at `root/path/memory.max`; a v1 `memory` hierarchy at
/// `root/memory/path/memory.limit_in_bytes`. Inside a container with its own cgroup namespace
/// the path is `/` and `root` is the container's cgroup; without one, the path names the host's
/// hierarchy, which the container does not see: then the container's own files at the top of
/// the mount are read. `None` when no limit is set or none can be read.
#[cfg(target_os = "linux")]
fn cgroup_memory_limit(root: &std::path::Path, groups: &[procfs::ProcessCGroup]) -> Option<u64> {
    let limit = |file: std::path::PathBuf| -> Option<u64> {
        let text = std::fs::read_to_string(file).ok()?;
        text.trim().parse::<u64>().ok().filter(|&n| n < UNLIMITED)
    };
    // `max`, unreadable files and unlimited values are no limit: the lowest of the others.
    let lowest = |mount: std::path::PathBuf, path: &str, file: &str| -> Option<u64> {
        let own = mount.join(path.trim_start_matches('/'));
        let dir = if own.join(file).exists() { own } else { mount.clone() };
        dir.ancestors().take_while(|d| d.starts_with(&mount)).filter_map(|d| limit(d.join(file))).min()
    };
    match groups.iter().find(|g| g.controllers.iter().any(|c| c == "memory")) {
        Some(v1) => lowest(root.join("memory"), &v1.pathname, "memory.limit_in_bytes"),
        None => groups
            .iter()
            .find(|g| g.hierarchy == 0)
            .and_then(|v2| lowest(root.to_path_buf(), &v2.pathname, "memory.max")),
    }
}

impl Collector for ProcessCollector {
    #[cfg(target_os = "linux")]
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(r) = Self::read() else { return Ok(()) };
        let gauge = |n: u64| ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX));
        let cpu = ConstCounter::new(r.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            // The encoder adds `_total` to a counter's name.
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            None,
            cpu.metric_type(),
        )?)?;
        let integers = [
            ("process_open_fds", "Number of open file descriptors.", Some(r.open_fds)),
            ("process_max_fds", "Maximum number of open file descriptors.", r.max_fds),
            ("process_virtual_memory_bytes", "Virtual memory size in bytes.", Some(r.virtual_bytes)),
            ("process_resident_memory_bytes", "Resident memory size in bytes.", Some(r.resident_bytes)),
            ("process_threads", "Number of OS threads in the process.", Some(r.threads)),
        ];
        for (name, help, value) in integers {
            let Some(value) = value else { continue };
            let metric = gauge(value);
            metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)?;
        }
        let start = ConstGauge::new(r.start_time_seconds);
        start.encode(encoder.encode_descriptor(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            None,
            start.metric_type(),
        )?)?;
        Ok(())
    }

    #[cfg(not(target_os = "linux"))]
    fn encode(&self, _encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        Ok(())
    }
}

#[cfg(test)]
#[cfg(target_os = "linux")]
mod tests {
    use super::*;

    /// `field` of `/proc/self/status` in kB, as bytes.
    fn status_bytes(field: &str) -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with(field)).unwrap();
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
    }

    #[test]
    fn the_reading_agrees_with_proc_and_grows_with_what_the_process_holds() {
        let before = ProcessCollector::read().unwrap();
        // 500 more descriptors are 500 more open fds (give or take those the tests running
        // beside this one open and close meanwhile).
        let files: Vec<std::fs::File> =
            (0..500).map(|_| std::fs::File::open("/proc/self/status").unwrap()).collect();
        // 64 MiB touched is at least 48 MiB more resident (whatever the other tests free).
        let block = std::hint::black_box(vec![1u8; 64 << 20]);
        let after = ProcessCollector::read().unwrap();
        assert!(after.open_fds.abs_diff(before.open_fds + 500) <= 50, "{before:?} {after:?}");
        assert!(after.resident_bytes >= before.resident_bytes + (48 << 20), "{before:?} {after:?}");
        // The kernel's own count in kB, within a page or two of the stat's pages.
        let rss = status_bytes("VmRSS:");
        assert!(
            after.resident_bytes.abs_diff(rss) < 1 << 20,
            "stat {} vs status {rss}",
            after.resident_bytes
        );
        assert!(after.virtual_bytes >= after.resident_bytes);
        assert!(after.threads >= 1 && after.cpu_seconds >= before.cpu_seconds);
        // Started within the test binary's life: before now, after a day ago.
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        assert!(
            after.start_time_seconds <= now + 1.0 && after.start_time_seconds > now - 86_400.0,
            "{after:?}"
        );
        drop((files, block));
    }

    /// A cgroup mount under a temporary directory, removed when dropped.
    struct Mount(std::path::PathBuf);

    impl std::ops::Deref for Mount {
        type Target = std::path::Path;
        fn deref(&self) -> &std::path::Path {
            &self.0
        }
    }

    impl Drop for Mount {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A cgroup mount holding `files` (path under the mount, content).
    fn mount(files: &[(&str, &str)]) -> Mount {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let root = std::env::temp_dir().join(format!(
            "apiserver-cgroup-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        ));
        for (path, content) in files {
            let file = root.join(path);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(file, content).unwrap();
        }
        std::fs::create_dir_all(&root).unwrap();
        Mount(root)
    }

    fn group(hierarchy: u32, controllers: &[&str], path: &str) -> procfs::ProcessCGroup {
        procfs::ProcessCGroup {
            hierarchy,
            controllers: controllers.iter().map(|c| (*c).to_owned()).collect(),
            pathname: path.to_owned(),
        }
    }

    fn v2(path: &str) -> Vec<procfs::ProcessCGroup> {
        vec![group(0, &[], path)]
    }

    #[test]
    fn the_memory_limit_is_the_lowest_of_the_cgroup_and_its_ancestors() {
        // cgroup v2 inside a container with its own namespace: `0::/`, the container's files
        // at the top of the mount.
        let root = mount(&[("memory.max", "536870912\n")]);
        assert_eq!(cgroup_memory_limit(&root, &v2("/")), Some(512 << 20));
        // No limit: `max`.
        let root = mount(&[("memory.max", "max\n")]);
        assert_eq!(cgroup_memory_limit(&root, &v2("/")), None);
        // The host's view: the container limited to 512 MiB inside a Pod limited to 256 MiB
        // (the kernel enforces both); the slice above unlimited.
        let pod = "kubepods.slice/kubepods-pod1.slice";
        let root = mount(&[
            ("kubepods.slice/memory.max", "max"),
            (&format!("{pod}/memory.max"), "268435456"),
            (&format!("{pod}/cri-abc.scope/memory.max"), "536870912"),
        ]);
        assert_eq!(cgroup_memory_limit(&root, &v2(&format!("/{pod}/cri-abc.scope"))), Some(256 << 20));
        // A path the mount does not hold (no cgroup namespace): the files at its top.
        let root = mount(&[("memory.max", "1073741824")]);
        assert_eq!(cgroup_memory_limit(&root, &v2("/kubepods/burstable/pod1/abc")), Some(1 << 30));
        // cgroup v1 (this machine's kind): the memory hierarchy, "unlimited" as a page-rounded
        // 2^63, a limit below it.
        let v1 =
            |path: &str| vec![group(4, &["memory"], path), group(0, &[], "/"), group(3, &["cpuset"], "/")];
        let root = mount(&[
            ("memory/memory.limit_in_bytes", "9223372036854771712\n"),
            ("memory/job/memory.limit_in_bytes", "9223372036854771712\n"),
            ("memory.max", "4096"),
        ]);
        assert_eq!(cgroup_memory_limit(&root, &v1("/job")), None, "unlimited, and v2 not consulted");
        std::fs::write(root.join("memory/job/memory.limit_in_bytes"), "134217728").unwrap();
        assert_eq!(cgroup_memory_limit(&root, &v1("/job")), Some(128 << 20));
        // Nothing readable: unknown.
        assert_eq!(cgroup_memory_limit(&mount(&[]), &v2("/")), None);
        assert_eq!(cgroup_memory_limit(&mount(&[("memory.max", "lots")]), &v2("/")), None);
    }
}
