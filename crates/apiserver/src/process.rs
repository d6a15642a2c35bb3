//! The process metrics every Prometheus client library exports, under the names client_golang
//! gives them (metrics-server's and kube-apiserver's): `process_resident_memory_bytes`,
//! `process_open_fds`, `process_cpu_seconds_total`, … Read from `/proc/self` when `/metrics`
//! is scraped, so that the alerts and dashboards written for any Go component watch this one
//! too; on other systems nothing is exported.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
#[cfg(target_os = "linux")]
use prometheus_client::metrics::counter::ConstCounter;
#[cfg(target_os = "linux")]
use prometheus_client::metrics::gauge::ConstGauge;

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
        })
    }

    #[cfg(not(target_os = "linux"))]
    pub(crate) fn read() -> Option<Reading> {
        None
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
}
