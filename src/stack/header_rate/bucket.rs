//! A token bucket of head bytes, one per client connection.

use std::time::Duration;

use tokio::time::Instant;

/// A token bucket of head bytes: `rate` a second, at most one second's worth
/// saved up.
#[derive(Debug)]
pub(super) struct Bucket {
    pub rate: u64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// A bucket holding `start` bytes (at most `rate`), filling from now.
    pub(super) fn new(rate: u64, start: u64) -> Self {
        Bucket { rate, tokens: start.min(rate) as f64, at: Instant::now() }
    }

    /// Spends `bytes` if the bucket holds them; if not, says how long until
    /// it would (a second at most: it never holds more).
    pub(super) fn spend(&mut self, bytes: u64) -> Result<(), Duration> {
        let now = Instant::now();
        let refill = now.duration_since(self.at).as_secs_f64() * self.rate as f64;
        self.tokens = (self.tokens + refill).min(self.rate as f64);
        self.at = now;
        let missing = bytes as f64 - self.tokens;
        if missing > 0.0 {
            return Err(Duration::from_secs_f64((missing / self.rate as f64).min(1.0)));
        }
        self.tokens -= bytes as f64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_bucket_starts_with_one_head_and_the_burst_accrues() {
        let mut bucket = Bucket::new(1000, 100);
        assert!(bucket.spend(101).is_err(), "a new bucket holds only its start");
        assert!(bucket.spend(100).is_ok());
        assert!(bucket.spend(1).is_err());
        // The rest of the second's burst comes with time.
        tokio::time::advance(Duration::from_millis(900)).await;
        assert!(bucket.spend(900).is_ok());
        assert!(bucket.spend(1).is_err());
        // A start above the rate is held to one second.
        let mut bucket = Bucket::new(1000, 5000);
        assert!(bucket.spend(1000).is_ok());
        assert!(bucket.spend(1).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn the_bucket_holds_one_second_and_refills_at_the_rate() {
        let mut bucket = Bucket::new(1000, 0);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(bucket.spend(600).is_ok());
        assert!(bucket.spend(600).is_err(), "only 400 left");
        assert!(bucket.spend(400).is_ok());
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(bucket.spend(500).is_ok());
        assert!(bucket.spend(1).is_err());
        // Idle for long: never more than one second saved up.
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(bucket.spend(1000).is_ok());
        assert!(bucket.spend(1).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_says_when_the_bucket_would_hold_the_head() {
        let mut bucket = Bucket::new(1000, 0);
        assert_eq!(bucket.spend(250), Err(Duration::from_millis(250)));
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(bucket.spend(250), Err(Duration::from_millis(150)));
        // A head larger than a second's worth never fits: a second at most.
        assert_eq!(bucket.spend(5000), Err(Duration::from_secs(1)));
    }
}
