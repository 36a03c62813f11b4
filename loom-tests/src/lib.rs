//! loom models for expiremap live in `tests/`; see README.md.
//!
//! Every model is also an ordinary test: without `--cfg expiremap_loom`,
//! [`model`] runs the closure once on real threads.

/// Runs `f` under loom when built with `--cfg expiremap_loom`, else once.
pub fn model<F>(f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    #[cfg(expiremap_loom)]
    loom::model(f);
    #[cfg(not(expiremap_loom))]
    f();
}

/// Thread spawn that matches the model: loom's under loom, std's otherwise.
#[cfg(expiremap_loom)]
pub use loom::thread;
/// Thread spawn that matches the model: loom's under loom, std's otherwise.
#[cfg(not(expiremap_loom))]
pub use std::thread;

/// [`model`] with at most `n` preemptions whatever `LOOM_MAX_PREEMPTIONS`
/// says: for a model whose full exploration at the CI's bound takes many
/// minutes, and whose races smaller models cover at that bound.
pub fn model_with_at_most_preemptions<F>(n: usize, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    #[cfg(expiremap_loom)]
    {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(builder.preemption_bound.map_or(n, |b| b.min(n)));
        builder.check(f);
    }
    #[cfg(not(expiremap_loom))]
    {
        let _ = n;
        f();
    }
}

/// [`model`] with at least `n` preemptions explored per execution (more
/// than `LOOM_MAX_PREEMPTIONS`, for a model whose bug needs them).
pub fn model_with_preemptions<F>(n: usize, f: F)
where
    F: Fn() + Sync + Send + 'static,
{
    #[cfg(expiremap_loom)]
    {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(builder.preemption_bound.unwrap_or(0).max(n));
        builder.check(f);
    }
    #[cfg(not(expiremap_loom))]
    {
        let _ = n;
        f();
    }
}

/// Runs a future to completion on this thread: a minimal executor that
/// parks the thread (loom's park under loom, std's otherwise) until the
/// future's waker unparks it. Under loom, a lost wake-up leaves the thread
/// parked forever, which loom reports as a deadlock.
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};

    struct Unpark(thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        thread::park();
    }
}
