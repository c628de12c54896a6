//! A persistent worker pool for the kernels: `threads - 1` workers that spin briefly, then
//! park, waiting for the next job; the calling thread takes part as worker 0. One dispatch
//! costs about a microsecond while the workers spin, instead of a fresh task spawn per op.
//!
//! A job is a `&dyn Fn(usize) + Sync` called once with each worker index `0..threads`; the
//! dispatch returns when every call has returned. When the pool is already running a job
//! (another model on another thread), the caller runs all indices itself instead of waiting.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, OnceLock};
use std::time::{Duration, Instant};

/// How long an idle worker spins before it parks.
const SPIN: Duration = Duration::from_millis(2);

#[derive(Clone, Copy)]
struct JobRef(*const (dyn Fn(usize) + Sync + 'static));

// SAFETY: the pointee is `Sync`, and `Pool::run` keeps it alive until every worker that
// received it has finished with it (see `run`).
unsafe impl Send for JobRef {}

struct Inner {
    generation: AtomicU64,
    pending: AtomicUsize,
    job: Mutex<Option<JobRef>>,
    sleepers: AtomicUsize,
    sleep_lock: std::sync::Mutex<()>,
    wake: Condvar,
    stop: AtomicBool,
    panicked: AtomicBool,
}

/// The pool. See the module documentation.
pub struct Pool {
    threads: usize,
    inner: Arc<Inner>,
    busy: Mutex<()>,
    handles: Vec<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("threads", &self.threads)
            .finish()
    }
}

impl Pool {
    /// A pool running jobs on `threads` threads (the caller plus `threads - 1` workers).
    pub fn new(threads: usize) -> Pool {
        let threads = threads.max(1);
        let inner = Arc::new(Inner {
            generation: AtomicU64::new(0),
            pending: AtomicUsize::new(0),
            job: Mutex::new(None),
            sleepers: AtomicUsize::new(0),
            sleep_lock: std::sync::Mutex::new(()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
        });
        let mut handles = Vec::new();
        for index in 1..threads {
            let inner = inner.clone();
            if let Ok(h) = std::thread::Builder::new()
                .name(format!("ferrograph-kernels-{index}"))
                .spawn(move || worker(&inner, index))
            {
                handles.push(h);
            }
        }
        // If a spawn failed, run with the workers that exist.
        let threads = handles.len() + 1;
        Pool {
            threads,
            inner,
            busy: Mutex::new(()),
            handles,
        }
    }

    /// Number of threads a job runs on.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The rate in GB/s at which this pool's threads read a buffer of `bytes` bytes (at least
    /// 64 MiB), each summing its share: the best of five passes. The buffer is read as the
    /// kernels read weights in decode (on huge pages where the system gives them, prefetched
    /// `prefetch_distance` ahead). A decode step reads every weight once, so a
    /// model's weight bytes times its decode rate can approach this for a buffer of the same
    /// size, not pass it by much (a buffer that fits the CPU's caches reads faster, as the
    /// weights do).
    pub fn stream_read_gb_s(&self, bytes: usize) -> f64 {
        let words = (bytes / 8).max(8 << 20);
        let mut buf: Vec<u64> = Vec::with_capacity(words);
        crate::hugepages::advise(&buf);
        buf.extend(0..words as u64);
        let parts: Vec<std::ops::Range<usize>> = self.split(words).collect();
        let ahead = crate::prefetch_distance();
        let mut best = 0f64;
        for _ in 0..5 {
            let start = Instant::now();
            self.run(&|tid| {
                if let Some(part) = parts.get(tid) {
                    let mut sum = 0u64;
                    // One cache line (eight words) per step.
                    for line in buf[part.clone()].chunks(8) {
                        if ahead > 0 {
                            crate::prefetch_lines(line.as_ptr() as *const u8, ahead, 1);
                        }
                        sum = line.iter().fold(sum, |a, &x| a.wrapping_add(x));
                    }
                    std::hint::black_box(sum);
                }
            });
            best = best.max((words * 8) as f64 / start.elapsed().as_secs_f64() / 1e9);
        }
        best
    }

    /// How `units` items are split over the threads: contiguous, non-empty ranges covering
    /// `0..units` in order, at most one per thread (one, possibly empty, when `units` is 0).
    pub fn split(&self, units: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
        let n = self.threads.min(units).max(1);
        (0..n).map(move |i| units * i / n..units * (i + 1) / n)
    }

    /// Splits `data` into one contiguous piece per thread, each a whole number of `unit`
    /// elements (the last takes any remainder), and calls `f(offset, piece)` on each in
    /// parallel, `offset` being the piece's first index in `data`.
    pub fn for_each_piece<T: Send>(
        &self,
        data: &mut [T],
        unit: usize,
        f: &(dyn Fn(usize, &mut [T]) + Sync),
    ) {
        let (len, unit) = (data.len(), unit.max(1));
        let units = len / unit;
        if self.threads.min(units) <= 1 {
            return f(0, data);
        }
        let mut pieces = Vec::with_capacity(self.threads);
        let mut rest = data;
        for r in self.split(units) {
            let start = r.start * unit;
            let end = if r.end == units { len } else { r.end * unit };
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(end - start);
            pieces.push(Mutex::new((start, head)));
            rest = tail;
        }
        self.run(&|tid| {
            if let Some(piece) = pieces.get(tid) {
                let mut piece = piece.lock();
                let (offset, data) = &mut *piece;
                f(*offset, data);
            }
        });
    }

    /// Calls `f(i)` for every `i` in `0..threads()`, in parallel, and returns when all calls
    /// have returned.
    pub fn run(&self, f: &(dyn Fn(usize) + Sync)) {
        if self.threads == 1 {
            f(0);
            return;
        }
        let Some(_busy) = self.busy.try_lock() else {
            for i in 0..self.threads {
                f(i);
            }
            return;
        };
        let short: *const (dyn Fn(usize) + Sync + '_) = f;
        // SAFETY: only the lifetime is erased. The pointer is handed to the workers below and
        // this function does not return before `pending` reaches zero, that is before every
        // worker has finished calling it, and it clears the slot before returning; so no use
        // of the pointer outlives the borrow `f`.
        let erased: *const (dyn Fn(usize) + Sync + 'static) = unsafe {
            std::mem::transmute::<
                *const (dyn Fn(usize) + Sync + '_),
                *const (dyn Fn(usize) + Sync + 'static),
            >(short)
        };
        *self.inner.job.lock() = Some(JobRef(erased));
        self.inner.pending.store(self.threads - 1, Ordering::SeqCst);
        self.inner.generation.fetch_add(1, Ordering::SeqCst);
        if self.inner.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = self.inner.sleep_lock.lock();
            self.inner.wake.notify_all();
        }
        // Wait for the workers even if our own share panics.
        let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(0)));
        let mut spins = 0u32;
        while self.inner.pending.load(Ordering::Acquire) != 0 {
            spins += 1;
            if spins > 1 << 16 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        *self.inner.job.lock() = None;
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if self.inner.panicked.swap(false, Ordering::SeqCst) {
            // A worker's panic is re-raised on the caller, like the caller's own share above:
            // the kernel's output is incomplete and must not be used.
            std::panic::resume_unwind(Box::new("a kernel worker panicked"));
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        self.inner.generation.fetch_add(1, Ordering::SeqCst);
        {
            let _g = self.inner.sleep_lock.lock();
            self.inner.wake.notify_all();
        }
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

fn worker(inner: &Inner, index: usize) {
    // The pool starts at generation 0: a job dispatched before this thread got here must
    // still be seen as new.
    let mut seen = 0;
    loop {
        let mut since = Instant::now();
        let mut spins = 0u32;
        loop {
            let g = inner.generation.load(Ordering::Acquire);
            if g != seen {
                seen = g;
                break;
            }
            spins = spins.wrapping_add(1);
            if !spins.is_multiple_of(256) || since.elapsed() < SPIN {
                std::hint::spin_loop();
                continue;
            }
            let mut guard = match inner.sleep_lock.lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            inner.sleepers.fetch_add(1, Ordering::SeqCst);
            while inner.generation.load(Ordering::SeqCst) == seen {
                guard = match inner.wake.wait(guard) {
                    Ok(g) => g,
                    Err(p) => p.into_inner(),
                };
            }
            inner.sleepers.fetch_sub(1, Ordering::SeqCst);
            drop(guard);
            since = Instant::now();
        }
        if inner.stop.load(Ordering::SeqCst) {
            return;
        }
        let job = *inner.job.lock();
        if let Some(job) = job {
            // SAFETY: `Pool::run` keeps the closure alive until `pending` reaches zero, which
            // happens only after this call returns (the decrement below).
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe {
                (*job.0)(index)
            }));
            if r.is_err() {
                inner.panicked.store(true, Ordering::SeqCst);
            }
        }
        inner.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

static REQUESTED: AtomicUsize = AtomicUsize::new(0);
static GLOBAL: OnceLock<Pool> = OnceLock::new();

/// Asks for `threads` threads in the process-wide pool. Takes effect only before the pool's
/// first use; returns the count in effect (or that will be).
pub fn set_threads(threads: usize) -> usize {
    if GLOBAL.get().is_none() && threads > 0 {
        REQUESTED.store(threads, Ordering::SeqCst);
    }
    GLOBAL
        .get()
        .map(Pool::threads)
        .unwrap_or_else(default_threads)
}

fn default_threads() -> usize {
    let requested = REQUESTED.load(Ordering::SeqCst);
    if requested > 0 {
        return requested;
    }
    for var in [
        "FERROGRAPH_THREADS",
        "CANDLE_NUM_THREADS",
        "RAYON_NUM_THREADS",
    ] {
        if let Some(n) = std::env::var(var)
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|n| *n > 0)
        {
            return n;
        }
    }
    std::thread::available_parallelism()
        .map(usize::from)
        .unwrap_or(1)
}

/// The process-wide pool, created on first use with [`set_threads`]'s count, else
/// `FERROGRAPH_THREADS`, `CANDLE_NUM_THREADS`, `RAYON_NUM_THREADS` or the number of CPUs.
pub fn global() -> &'static Pool {
    GLOBAL.get_or_init(|| Pool::new(default_threads()))
}
