//! Per-worker circuit breaker.
//!
//! Closed: requests flow; `failure_threshold` consecutive failures open the circuit.
//! Open: the worker gets no requests until `open_duration` has passed, then the circuit is
//! half-open. Half-open: one probe request at a time is let through; `success_threshold`
//! consecutive successful probes close the circuit, any failure opens it again.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Breaker settings (`--cb-*` flags).
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerConfig {
    /// Consecutive failures that open a closed circuit; 0 disables the breaker.
    pub failure_threshold: u32,
    /// Consecutive successful probes that close a half-open circuit.
    pub success_threshold: u32,
    /// How long an open circuit refuses requests before it lets a probe through.
    pub open_duration: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            failure_threshold: 10,
            success_threshold: 3,
            open_duration: Duration::from_secs(60),
        }
    }
}

/// The externally visible state of a breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

impl BreakerState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half_open",
        }
    }

    /// Gauge value: 0 closed, 1 open, 2 half-open.
    pub fn as_gauge(self) -> i64 {
        match self {
            Self::Closed => 0,
            Self::Open => 1,
            Self::HalfOpen => 2,
        }
    }
}

#[derive(Debug)]
enum Inner {
    Closed {
        failures: u32,
    },
    Open {
        since: Instant,
    },
    HalfOpen {
        successes: u32,
        probe_in_flight: bool,
    },
}

#[derive(Debug)]
pub struct CircuitBreaker {
    config: BreakerConfig,
    inner: Mutex<Inner>,
}

impl CircuitBreaker {
    pub fn new(config: BreakerConfig) -> Self {
        Self {
            config,
            inner: Mutex::new(Inner::Closed { failures: 0 }),
        }
    }

    fn enabled(&self) -> bool {
        self.config.failure_threshold > 0
    }

    /// The state now; an open circuit whose wait has passed reads as half-open.
    pub fn state(&self) -> BreakerState {
        match &*self.inner.lock() {
            Inner::Closed { .. } => BreakerState::Closed,
            Inner::Open { since } if since.elapsed() >= self.config.open_duration => {
                BreakerState::HalfOpen
            }
            Inner::Open { .. } => BreakerState::Open,
            Inner::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// Whether a request could be sent now (does not claim the half-open probe).
    pub fn can_attempt(&self) -> bool {
        if !self.enabled() {
            return true;
        }
        match &*self.inner.lock() {
            Inner::Closed { .. } => true,
            Inner::Open { since } => since.elapsed() >= self.config.open_duration,
            Inner::HalfOpen {
                probe_in_flight, ..
            } => !probe_in_flight,
        }
    }

    /// Claims the right to send one request. In the half-open state only one caller at a
    /// time gets it; it must then report with `record_success` or `record_failure`.
    pub fn try_acquire(&self) -> bool {
        if !self.enabled() {
            return true;
        }
        let mut inner = self.inner.lock();
        match &mut *inner {
            Inner::Closed { .. } => true,
            Inner::Open { since } => {
                if since.elapsed() >= self.config.open_duration {
                    *inner = Inner::HalfOpen {
                        successes: 0,
                        probe_in_flight: true,
                    };
                    true
                } else {
                    false
                }
            }
            Inner::HalfOpen {
                probe_in_flight, ..
            } => {
                if *probe_in_flight {
                    false
                } else {
                    *probe_in_flight = true;
                    true
                }
            }
        }
    }

    /// Returns the half-open probe slot without an outcome (the request was never sent).
    pub fn release(&self) {
        if let Inner::HalfOpen {
            probe_in_flight, ..
        } = &mut *self.inner.lock()
        {
            *probe_in_flight = false;
        }
    }

    pub fn record_success(&self) {
        if !self.enabled() {
            return;
        }
        let mut inner = self.inner.lock();
        match &mut *inner {
            Inner::Closed { failures } => *failures = 0,
            Inner::Open { .. } => {}
            Inner::HalfOpen {
                successes,
                probe_in_flight,
            } => {
                *successes += 1;
                *probe_in_flight = false;
                if *successes >= self.config.success_threshold {
                    *inner = Inner::Closed { failures: 0 };
                }
            }
        }
    }

    pub fn record_failure(&self) {
        if !self.enabled() {
            return;
        }
        let mut inner = self.inner.lock();
        match &mut *inner {
            Inner::Closed { failures } => {
                *failures += 1;
                if *failures >= self.config.failure_threshold {
                    *inner = Inner::Open {
                        since: Instant::now(),
                    };
                }
            }
            Inner::Open { .. } => {}
            Inner::HalfOpen { .. } => {
                *inner = Inner::Open {
                    since: Instant::now(),
                }
            }
        }
    }

    /// Back to closed with no failures (the worker was re-added or recovered).
    pub fn reset(&self) {
        *self.inner.lock() = Inner::Closed { failures: 0 };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker(open_ms: u64) -> CircuitBreaker {
        CircuitBreaker::new(BreakerConfig {
            failure_threshold: 3,
            success_threshold: 2,
            open_duration: Duration::from_millis(open_ms),
        })
    }

    #[test]
    fn opens_after_consecutive_failures_only() {
        let b = breaker(10_000);
        b.record_failure();
        b.record_failure();
        b.record_success(); // resets the streak
        b.record_failure();
        b.record_failure();
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(b.try_acquire());
        b.record_failure();
        assert_eq!(b.state(), BreakerState::Open);
        assert!(!b.can_attempt());
        assert!(!b.try_acquire());
    }

    #[test]
    fn half_open_admits_one_probe_and_closes_after_enough_successes() {
        let b = breaker(200);
        for _ in 0..3 {
            b.record_failure();
        }
        assert!(!b.try_acquire());
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(b.state(), BreakerState::HalfOpen);
        assert!(b.can_attempt());
        assert!(b.try_acquire(), "first probe");
        assert!(!b.can_attempt());
        assert!(!b.try_acquire(), "second concurrent probe refused");
        b.record_success();
        assert_eq!(b.state(), BreakerState::HalfOpen, "one success of two");
        assert!(b.try_acquire());
        b.record_success();
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(b.try_acquire() && b.try_acquire());
    }

    #[test]
    fn failed_probe_reopens() {
        let b = breaker(200);
        for _ in 0..3 {
            b.record_failure();
        }
        std::thread::sleep(Duration::from_millis(250));
        assert!(b.try_acquire());
        b.record_failure();
        assert_eq!(b.state(), BreakerState::Open);
        assert!(!b.try_acquire());
    }

    #[test]
    fn released_probe_can_be_claimed_again() {
        let b = breaker(0);
        for _ in 0..3 {
            b.record_failure();
        }
        assert!(b.try_acquire());
        assert!(!b.try_acquire());
        b.release();
        assert!(b.try_acquire());
    }

    #[test]
    fn zero_threshold_disables_the_breaker() {
        let b = CircuitBreaker::new(BreakerConfig {
            failure_threshold: 0,
            ..BreakerConfig::default()
        });
        for _ in 0..100 {
            b.record_failure();
        }
        assert_eq!(b.state(), BreakerState::Closed);
        assert!(b.try_acquire());
    }
}
