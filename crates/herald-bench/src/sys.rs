//! The few OS facts the bench needs: its own CPU time, CPU affinity, the open-file limit, and
//! what else took the server's core.

/// CPU seconds (user + system) used so far by this process, all threads.
pub fn cpu_seconds() -> f64 {
    rusage_seconds(libc::RUSAGE_SELF)
}

/// CPU seconds (user + system) used so far by the calling thread.
pub fn thread_cpu_seconds() -> f64 {
    rusage_seconds(libc::RUSAGE_THREAD)
}

fn rusage_seconds(who: libc::c_int) -> f64 {
    // SAFETY: getrusage only writes into the struct we pass.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(who, &mut ru) != 0 {
            return 0.0;
        }
        let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        tv(ru.ru_utime) + tv(ru.ru_stime)
    }
}

/// Cores this process may run on (its affinity mask), at least 1.
pub fn allowed_cores() -> usize {
    // SAFETY: sched_getaffinity writes into the set we pass, of the size we give.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
            let n = libc::CPU_COUNT(&set);
            if n > 0 {
                return n as usize;
            }
        }
    }
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Online cores on the machine.
pub fn machine_cores() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n > 0 {
        n as usize
    } else {
        1
    }
}

/// Total memory in GiB (rounded), for the report.
pub fn machine_mem_gib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map(|kb| (kb as f64 / 1024.0 / 1024.0).round() as u64)
        .unwrap_or(0)
}

fn cpu_set(core: usize) -> libc::cpu_set_t {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes one bit inside it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        set
    }
}

/// Pins the calling thread (in a `pre_exec` hook: the child about to exec) to one core.
pub fn pin_current_thread(core: usize) -> std::io::Result<()> {
    let set = cpu_set(core);
    // SAFETY: pid 0 is the calling thread; the set is valid for its size.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Pins every thread of this process to one core (threads started later inherit it from the
/// thread that starts them).
pub fn pin_process(core: usize) -> std::io::Result<()> {
    let set = cpu_set(core);
    for e in std::fs::read_dir("/proc/self/task")? {
        let Some(tid) = e?
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        // SAFETY: as above, for a thread id of this process.
        unsafe {
            libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
    Ok(())
}

/// Raises the soft open-file limit to the hard one; returns the new soft limit.
pub fn raise_nofile() -> u64 {
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 1024;
        }
        if r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
        r.rlim_cur
    }
}

/// CPU seconds (user + system) used so far by another process, from /proc/PID/stat.
pub fn process_cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which is in parentheses and may hold spaces):
    // state is field 3, utime 14 and stime 15 — indexes 11 and 12 here.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Some(ticks / if hz > 0 { hz as f64 } else { 100.0 })
}

/// Nanoseconds the threads of a process have spent runnable but not running: on a core of
/// its own, the time other tasks held it (kernel threads like `kdamond`, and `ksoftirqd`
/// running softirq work the kernel deferred, often the process's own network work).
/// Sums `/proc/PID/task/*/schedstat` (its second field); threads gone since are not counted.
pub fn process_run_delay_ns(pid: u32) -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let Ok(stat) = std::fs::read_to_string(task.ok()?.path().join("schedstat")) else {
            continue;
        };
        total += stat
            .split_whitespace()
            .nth(1)
            .and_then(|w| w.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Some(total)
}

/// Each core's steal so far (`/proc/stat`, the eighth figure of `cpuN`), in ms: time the
/// hypervisor gave the virtual core's host CPU to someone else. Counted in ticks (10 ms here).
pub fn steal_ms_per_core() -> Vec<f64> {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let ms_per_tick = 1000.0 / if hz > 0 { hz as f64 } else { 100.0 };
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    stat.lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .map(|l| {
            l.split_whitespace()
                .nth(8)
                .and_then(|w| w.parse::<f64>().ok())
                .map_or(0.0, |ticks| ticks * ms_per_tick)
        })
        .collect()
}

/// What else took the cores in a window, beside the load: the server waiting for its core while
/// other tasks ran on it, and the host's steal per core. A tail of a few ms can be either, not
/// herald's (the kernel's `kdamond`, for one, holds a core for milliseconds every 512 ms on
/// this VM: docs/performance.md).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Contention {
    /// ms the spawned server's threads were runnable but not running (with `--spawn`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_waited_ms: Option<f64>,
    /// ms of steal per core (index = core), as the kernel counts it (in ticks).
    pub steal_ms: Vec<f64>,
}

/// Measures this process's CPU use over an interval (and a spawned server's, when given), and
/// what else took the cores meanwhile ([`Contention`]).
#[derive(Debug, Clone)]
pub struct CpuMeter {
    cpu0: f64,
    t0: std::time::Instant,
    server: Option<(u32, f64)>,
    server_delay_ns: Option<u64>,
    steal_ms: Vec<f64>,
}

impl CpuMeter {
    pub fn start() -> CpuMeter {
        CpuMeter::start_with(None)
    }

    pub fn start_with(server_pid: Option<u32>) -> CpuMeter {
        CpuMeter {
            cpu0: cpu_seconds(),
            t0: std::time::Instant::now(),
            server: server_pid.and_then(|p| Some((p, process_cpu_seconds(p)?))),
            server_delay_ns: server_pid.and_then(process_run_delay_ns),
            steal_ms: steal_ms_per_core(),
        }
    }

    /// What else took the cores since start.
    pub fn contention(&self) -> Contention {
        let waited = match (self.server, self.server_delay_ns) {
            (Some((pid, _)), Some(d0)) => process_run_delay_ns(pid).map(|d| d.saturating_sub(d0)),
            _ => None,
        };
        Contention {
            server_waited_ms: waited.map(|ns| ns as f64 / 1e6),
            steal_ms: steal_ms_per_core()
                .iter()
                .zip(&self.steal_ms)
                .map(|(now, then)| (now - then).max(0.0))
                .collect(),
        }
    }

    /// (CPU seconds used since start, wall seconds since start).
    pub fn read(&self) -> (f64, f64) {
        (cpu_seconds() - self.cpu0, self.t0.elapsed().as_secs_f64())
    }

    /// The server's CPU use since start, in cores (1.0 = one core busy).
    pub fn server_cores(&self) -> Option<f64> {
        let (pid, c0) = self.server?;
        let wall = self.t0.elapsed().as_secs_f64();
        Some((process_cpu_seconds(pid)? - c0) / wall.max(1e-9))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_meter_sees_busy_work() {
        let m = CpuMeter::start();
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed().as_millis() < 50 {
            x = x.wrapping_mul(31).wrapping_add(1);
        }
        std::hint::black_box(x);
        let (cpu, wall) = m.read();
        assert!(cpu > 0.02 && wall >= 0.05, "cpu {cpu} wall {wall}");
        assert!(allowed_cores() >= 1 && machine_cores() >= 1);
        let me = CpuMeter::start_with(Some(std::process::id()));
        let t = std::time::Instant::now();
        while t.elapsed().as_millis() < 50 {
            x = x.wrapping_mul(31).wrapping_add(1);
        }
        std::hint::black_box(x);
        assert!(me.server_cores().unwrap() > 0.0);
    }

    #[test]
    fn contention_sees_a_thread_kept_from_its_core() {
        let me = std::process::id();
        let meter = CpuMeter::start_with(Some(me));
        assert_eq!(steal_ms_per_core().len(), machine_cores());
        // Two busy threads on one core: each waits while the other runs. Read while they are
        // still there (a thread's count goes with it).
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let busy = || {
            let stop = stop.clone();
            std::thread::spawn(move || {
                pin_current_thread(0).unwrap();
                let mut x = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    x = x.wrapping_mul(31).wrapping_add(1);
                }
                std::hint::black_box(x);
            })
        };
        let threads = [busy(), busy()];
        std::thread::sleep(std::time::Duration::from_millis(300));
        let c = meter.contention();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
        assert!(c.server_waited_ms.unwrap() > 100.0, "{c:?}");
        assert_eq!(c.steal_ms.len(), machine_cores());
    }
}
