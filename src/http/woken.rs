//! Watchers polled only when they were woken.
//!
//! A connection's task is woken several times per request by its socket, and
//! `tokio::select!` polls every branch on every wake: the guards' timer, the
//! refusal signal and shutdown's two tokens each took a lock to check that
//! nothing had changed, at a cost per request above the fence decision's
//! (docs/perf-log.md). [`WokenOnly`] gives the future it wraps a waker of its own and
//! polls it again only once that waker was used: the task's other wakes pass
//! it by. Everything it wraps must be driven by its wakers (timers, `Notify`,
//! cancellation), never by being polled: what it waits for is then seen on
//! the wake that announces it, as before.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};

pin_project_lite::pin_project! {
    /// `inner`, polled on its first poll and after its own waker was woken.
    pub(crate) struct WokenOnly<F> {
        #[pin]
        inner: F,
        flag: Arc<Flag>,
        waker: Waker,
        // The task's waker last handed to `flag`, to compare without its lock.
        task: Option<Waker>,
    }
}

/// Whether the inner future was woken, and the task to wake when it is.
#[derive(Default)]
struct Flag {
    woken: AtomicBool,
    task: Mutex<Option<Waker>>,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        let task = self.task.lock().unwrap_or_else(PoisonError::into_inner).clone();
        if let Some(task) = task {
            task.wake();
        }
    }
}

impl<F> WokenOnly<F> {
    pub(crate) fn new(inner: F) -> Self {
        let flag = Arc::new(Flag { woken: AtomicBool::new(true), task: Mutex::default() });
        let waker = Waker::from(flag.clone());
        WokenOnly { inner, flag, waker, task: None }
    }
}

impl<F: Future> Future for WokenOnly<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        // Wakes go to the task polling now (a task's waker rarely changes).
        if !this.task.as_ref().is_some_and(|t| t.will_wake(cx.waker())) {
            *this.task = Some(cx.waker().clone());
            *this.flag.task.lock().unwrap_or_else(PoisonError::into_inner) = Some(cx.waker().clone());
        }
        // Cleared before polling: a wake during the poll makes the next poll count.
        if !this.flag.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        this.inner.poll(&mut Context::from_waker(this.waker))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    /// Counts its polls; ready once `ready` is set, waking through the
    /// waker it was last polled with when `wake` is called.
    #[derive(Default)]
    struct Probe {
        polls: AtomicUsize,
        ready: AtomicBool,
        waker: Mutex<Option<Waker>>,
    }

    impl Probe {
        fn wake(&self) {
            self.ready.store(true, Ordering::SeqCst);
            if let Some(w) = self.waker.lock().unwrap().take() {
                w.wake();
            }
        }
    }

    fn watched(probe: &Arc<Probe>) -> impl Future<Output = ()> {
        let probe = probe.clone();
        std::future::poll_fn(move |cx| {
            probe.polls.fetch_add(1, Ordering::SeqCst);
            if probe.ready.load(Ordering::SeqCst) {
                return Poll::Ready(());
            }
            *probe.waker.lock().unwrap() = Some(cx.waker().clone());
            Poll::Pending
        })
    }

    /// The task's other wakes don't poll it; its own wake does, and it
    /// resolves on that wake.
    #[tokio::test(start_paused = true)]
    async fn polled_first_and_then_only_when_its_own_waker_was_used() {
        let probe = Arc::new(Probe::default());
        let mut watched = std::pin::pin!(WokenOnly::new(watched(&probe)));
        let mut ticks = 0;
        let resolved_after = loop {
            tokio::select! {
                biased;
                () = watched.as_mut() => break ticks,
                // Another branch waking the task again and again.
                () = tokio::time::sleep(Duration::from_millis(1)) => {
                    ticks += 1;
                    if ticks == 50 {
                        probe.wake();
                    }
                }
            }
        };
        assert_eq!(resolved_after, 50, "seen on the wake that announced it");
        assert_eq!(probe.polls.load(Ordering::SeqCst), 2, "the first poll and the one after its wake");
    }

    /// A wake from another thread reaches the task.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wake_from_another_thread_reaches_the_task() {
        let probe = Arc::new(Probe::default());
        let waker = probe.clone();
        let wake = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            waker.wake();
        });
        tokio::time::timeout(Duration::from_secs(5), WokenOnly::new(watched(&probe))).await.expect("never woken");
        wake.join().unwrap();
    }
}
