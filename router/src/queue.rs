//! The activator queue: requests that arrive while no worker can take them wait here for one.
//!
//! A service scaled to zero has a router and no engine. The router stays ready, and a request
//! that finds no available worker (none registered, none healthy, every breaker open) waits
//! until one becomes available, instead of being refused. The queue is bounded twice:
//! at most `--queue-size` requests wait at once, and each waits at most
//! `--queue-timeout-secs`; a request beyond either bound is answered 503 with `Retry-After`.
//! The number waiting is exported as `sgl_router_pending_requests`: it is the signal that
//! brings a service up from zero (the operator's HPA reads it, clamped to 1, as an Object
//! metric of the router's Service; a KEDA trigger activates on `> 0`).
//!
//! Waiters are woken when a worker becomes healthy, when one is added, and after every round
//! of health checks (which is also when an open breaker's timeout shows); each woken waiter
//! asks the policy again, so the usual routing rules apply to queued requests too.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

/// Seconds a client is told to wait (`Retry-After`) when the router cannot take a request.
pub const RETRY_AFTER_SECS: u64 = 5;

pub struct WaitQueue {
    capacity: usize,
    timeout: Duration,
    pending: AtomicUsize,
    ready: Notify,
}

/// A place in the queue; leaving (served, timed out, client gone) frees it.
pub struct Ticket<'a>(&'a WaitQueue);

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        self.0.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

impl WaitQueue {
    /// `capacity` 0 disables waiting: requests without a worker are refused at once.
    pub fn new(capacity: usize, timeout: Duration) -> Self {
        Self {
            capacity,
            timeout,
            pending: AtomicUsize::new(0),
            ready: Notify::new(),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Requests waiting now.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }

    /// Takes a place, or `None` when the queue is full.
    pub fn try_enter(&self) -> Option<Ticket<'_>> {
        self.pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.capacity).then_some(n + 1)
            })
            .ok()
            .map(|_| Ticket(self))
    }

    /// Wakes every waiter to look for a worker again.
    pub fn notify_ready(&self) {
        self.ready.notify_waiters();
    }

    /// Resolves at the next `notify_ready`. Call `enable` on the pinned future before
    /// checking for a worker, so that a wake-up between the check and the wait is not lost.
    pub fn ready(&self) -> tokio::sync::futures::Notified<'_> {
        self.ready.notified()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_bounded_and_given_back() {
        let q = WaitQueue::new(2, Duration::from_secs(1));
        let a = q.try_enter().unwrap();
        let b = q.try_enter().unwrap();
        assert_eq!(q.pending(), 2);
        assert!(q.try_enter().is_none(), "full");
        drop(a);
        assert_eq!(q.pending(), 1);
        let _c = q.try_enter().unwrap();
        drop(b);
        assert_eq!(q.pending(), 1);
        assert!(
            WaitQueue::new(0, Duration::from_secs(1))
                .try_enter()
                .is_none()
        );
    }

    #[tokio::test]
    async fn a_wake_up_between_the_check_and_the_wait_is_kept() {
        let q = WaitQueue::new(1, Duration::from_secs(1));
        let ready = q.ready();
        tokio::pin!(ready);
        ready.as_mut().enable();
        q.notify_ready();
        tokio::time::timeout(Duration::from_secs(5), ready)
            .await
            .unwrap();
    }
}
