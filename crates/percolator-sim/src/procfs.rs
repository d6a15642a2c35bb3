//! What a process holds, read from `/proc/<pid>` (Linux): resident memory and its peak,
//! threads and other `status` fields, CPU time, open descriptors, transparent huge pages. The
//! one reader of the end-to-end tests, the benchmark and the soak. A process that is gone (or
//! a field the kernel does not have) reads as `None`: the soak and the benchmark count it as
//! 0, the tests fail saying which field was missing.

/// The value of `field` (`VmRSS`, `Threads`, `THP_enabled`, `Uid`…) in `/proc/<pid>/status`
/// (`pid` may be `self`), trimmed.
pub fn status(pid: impl std::fmt::Display, field: &str) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status_field(&text, field)
}

/// The first number of `field`'s value in `/proc/<pid>/status`: KiB for the `Vm*` fields
/// (`VmRSS:  1234 kB`), a count for `Threads`.
pub fn status_number(pid: u32, field: &str) -> Option<u64> {
    status(pid, field)?.split_whitespace().next()?.parse().ok()
}

/// The value of `field` in a `/proc/<pid>/status` text.
fn status_field(text: &str, field: &str) -> Option<String> {
    text.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':')).map(|v| v.trim().to_owned())
}

/// CPU seconds (user and system) the process has used.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(cpu_ticks(&stat)? as f64 / CLOCK_TICKS_PER_SECOND)
}

/// utime + stime of a `/proc/PID/stat` line: its 14th and 15th fields, the 12th and 13th
/// after the command, which is in parentheses and may hold spaces and parentheses.
fn cpu_ticks(stat: &str) -> Option<u64> {
    let after = stat.rsplit_once(')')?.1;
    let mut fields = after.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// `sysconf(_SC_CLK_TCK)`, 100 on every Linux architecture percolator is built for.
const CLOCK_TICKS_PER_SECOND: f64 = 100.0;

/// `AnonHugePages` of the process, in bytes (`/proc/<pid>/smaps_rollup`).
pub fn anon_huge_pages_bytes(pid: u32) -> Option<u64> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let kib: u64 = status_field(&rollup, "AnonHugePages")?.split_whitespace().next()?.parse().ok()?;
    Some(kib * 1024)
}

/// How many file descriptors the process has open (`/proc/<pid>/fd`).
pub fn open_fds(pid: u32) -> Option<u64> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64)
}

/// Whether a process `pid` runs.
pub fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_are_read_past_a_command_with_spaces() {
        let stat = "4242 (tokio (w) 1) S 1 4242 4242 0 -1 4194560 7 0 0 0 1500 250 0 0 20 0 3 0 99 1 2\n";
        assert_eq!(cpu_ticks(stat), Some(1750));
        assert_eq!(cpu_ticks(""), None, "a process that is gone");
    }

    #[test]
    fn a_status_field_is_found_by_its_whole_name() {
        let text = "Name:\tpercolator\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\nThreads:\t7\n";
        assert_eq!(status_field(text, "VmRSS").as_deref(), Some("1024 kB"));
        assert_eq!(status_field(text, "Threads").as_deref(), Some("7"));
        assert_eq!(status_field(text, "Vm"), None, "a prefix of a name is not the name");
        assert_eq!(status_field(text, "VmSwap"), None);
    }

    #[test]
    fn this_process_reads_as_running_with_memory_threads_and_descriptors() {
        let pid = std::process::id();
        assert!(alive(pid));
        assert!(status_number(pid, "VmRSS").is_some_and(|kib| kib > 0));
        assert!(status_number(pid, "Threads").is_some_and(|n| n >= 1));
        assert!(open_fds(pid).is_some_and(|n| n >= 3), "stdin, stdout, stderr");
        assert!(cpu_seconds(pid).is_some());
        assert_eq!(status(pid, "Name"), status("self", "Name"));
        assert_eq!(status_number(u32::MAX, "VmRSS"), None, "no such process");
        assert!(!alive(u32::MAX));
    }
}
