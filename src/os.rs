//! What the server asks of the operating system beyond `std`: a thread's
//! scheduling policy. The one place for it, so the modules that use it
//! (the store) keep no unsafe code.

/// Puts the calling thread under `SCHED_BATCH`: woken, it waits for the
/// running thread to block or use up its slice instead of preempting it.
///
/// For SQLite's writer and checkpointer threads. Each write wakes the
/// writer; under the default policy a woken thread preempts the tokio
/// worker that queued the write, so on a busy core the writer took its
/// writes one at a time (measured at C=64 on one core: 9 batches in 10 of
/// a single write), paying a context switch each way and a commit per
/// write. Left to wait for the worker, it finds a batch queued (about 40
/// writes), and each commit's pages and WAL frames are shared by all of
/// them. Where a core is idle the woken thread runs there at once, as
/// before. A policy the system refuses (another kernel, a sandbox) leaves
/// the default, which is only slower.
pub fn no_wakeup_preemption() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `param` is a valid sched_param; pid 0 is the calling
        // thread (Linux schedules threads), and SCHED_BATCH with priority
        // 0 needs no privilege.
        let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
        if rc != 0 {
            tracing::debug!(
                error = %std::io::Error::last_os_error(),
                "SCHED_BATCH refused; the thread keeps the default policy"
            );
        }
    }
}
