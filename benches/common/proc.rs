//! What `/proc` says of a process or thread: CPU seconds and resident memory (Linux), for
//! the benches that measure processes of their own.

/// CPU seconds (user and system) from a `stat` file (`/proc/PID/stat`,
/// `/proc/PID/task/TID/stat`), in clock ticks of 1/100 s.
pub fn cpu_seconds(stat: &std::path::Path) -> f64 {
    let stat = std::fs::read_to_string(stat).unwrap_or_default();
    let f: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// Resident memory of process `pid`, MB.
pub fn rss_mb(pid: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}
