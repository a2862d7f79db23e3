//! Settings for the whole process, made once at start by the `herald` command (not by
//! [`crate::Server`], which tests also run inside their own processes).

/// Raises this process's open-file limit to its hard maximum: every connection is a file.
pub fn raise_open_file_limit() {
    // SAFETY: getrlimit/setrlimit only read and write the struct passed to them.
    unsafe {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                tracing::warn!("could not raise the open-file limit");
            }
        }
    }
}

/// Lets the kernel back this process's memory with transparent huge pages, or not
/// (`prctl(PR_SET_THP_DISABLE)`; inherited by child processes, so it is always set, both ways).
///
/// herald's allocator (mimalloc) asks for huge pages on its arenas (`MADV_HUGEPAGE`), so while
/// the heap grows (the topics' histories fill during the first half-minute of a load) each
/// fault stops the thread to zero 2 MiB at once, milliseconds for memory fresh to the machine,
/// and the kernel may compact memory first (`defrag = madvise`). Small pages cost more in all
/// but in faults of microseconds, which is what a latency tail needs (the pairs that show it
/// are in bench/RESULTS.md). Redis and MongoDB advise the same.
pub fn set_transparent_huge_pages(allowed: bool) -> std::io::Result<()> {
    let disable = libc::c_ulong::from(!allowed);
    // SAFETY: PR_SET_THP_DISABLE reads only its integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, disable, 0, 0, 0) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
