//! Retry schedule: exponential backoff with jitter, and which failures are worth a retry.

use std::time::Duration;

use http::StatusCode;
use rand::Rng;

/// Retry settings (`--retry-*` flags).
#[derive(Debug, Clone, PartialEq)]
pub struct RetryConfig {
    /// Retries after the first attempt; 0 sends each request once.
    pub max_retries: u32,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    /// Growth of the backoff per retry (at least 1).
    pub multiplier: f64,
    /// Each backoff is drawn uniformly within ±`jitter` of its nominal value (0..1).
    pub jitter: f64,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            max_retries: 5,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(30),
            multiplier: 1.5,
            jitter: 0.2,
        }
    }
}

impl RetryConfig {
    /// Nominal backoff before retry number `retry` (0-based), before jitter.
    pub fn nominal_backoff(&self, retry: u32) -> Duration {
        let factor = self.multiplier.powi(retry.min(1_000) as i32);
        let secs = self.initial_backoff.as_secs_f64() * factor;
        Duration::from_secs_f64(secs.min(self.max_backoff.as_secs_f64()))
    }

    /// Backoff before retry number `retry` (0-based), jittered, never above `max_backoff`.
    pub fn backoff<R: Rng + ?Sized>(&self, retry: u32, rng: &mut R) -> Duration {
        let nominal = self.nominal_backoff(retry).as_secs_f64();
        let spread = nominal * self.jitter;
        let secs = if spread > 0.0 {
            rng.random_range((nominal - spread)..=(nominal + spread))
        } else {
            nominal
        };
        Duration::from_secs_f64(secs.clamp(0.0, self.max_backoff.as_secs_f64()))
    }
}

/// Statuses that say "this worker cannot serve right now": retried on another worker.
pub fn is_retryable_status(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
    )
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    #[test]
    fn backoff_grows_geometrically_up_to_the_cap() {
        let c = RetryConfig {
            max_retries: 10,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(1_000),
            multiplier: 2.0,
            jitter: 0.0,
        };
        let mut rng = StdRng::seed_from_u64(1);
        let got: Vec<u128> = (0..6).map(|i| c.backoff(i, &mut rng).as_millis()).collect();
        assert_eq!(got, [100, 200, 400, 800, 1_000, 1_000]);
        assert_eq!(c.nominal_backoff(u32::MAX), Duration::from_millis(1_000));
    }

    #[test]
    fn jitter_stays_within_its_band_and_varies() {
        let c = RetryConfig {
            jitter: 0.2,
            ..RetryConfig::default()
        };
        let mut rng = StdRng::seed_from_u64(7);
        let nominal = c.nominal_backoff(3).as_secs_f64();
        let draws: Vec<f64> = (0..200)
            .map(|_| c.backoff(3, &mut rng).as_secs_f64())
            .collect();
        for d in &draws {
            assert!(
                *d >= nominal * 0.8 - 1e-9 && *d <= nominal * 1.2 + 1e-9,
                "{d} vs {nominal}"
            );
        }
        let min = draws.iter().cloned().fold(f64::MAX, f64::min);
        let max = draws.iter().cloned().fold(0.0, f64::max);
        assert!(
            max - min > nominal * 0.2,
            "draws should spread over the band"
        );
    }

    #[test]
    fn jitter_never_exceeds_the_cap() {
        let c = RetryConfig {
            initial_backoff: Duration::from_millis(900),
            max_backoff: Duration::from_millis(1_000),
            multiplier: 1.0,
            jitter: 0.5,
            ..RetryConfig::default()
        };
        let mut rng = StdRng::seed_from_u64(3);
        for _ in 0..100 {
            assert!(c.backoff(0, &mut rng) <= Duration::from_millis(1_000));
        }
    }

    #[test]
    fn only_gateway_statuses_are_retryable() {
        for s in [502, 503, 504] {
            assert!(is_retryable_status(StatusCode::from_u16(s).unwrap()));
        }
        for s in [200, 400, 404, 429, 500, 501] {
            assert!(!is_retryable_status(StatusCode::from_u16(s).unwrap()));
        }
    }
}
