//! Addresses whose connections were closed for abuse wait before their next
//! connection is served.
//!
//! A flood that gets its connection closed (a run of refusals, or HTTP/2's
//! GOAWAY for too many resets or refused streams) reconnects at once, and a
//! new connection costs a handshake and a few dozen decoded heads before the
//! guards close it again: the hostile benchmark's `reset` attack reconnects
//! by the tens of thousands (docs/perf-log.md), a core of the proxy's time
//! taken from the clients beside it. So each such close strikes the client's address (and
//! so does a run of [`REFUSALS_IN_A_ROW`] refusals spread over connections
//! the client closed itself just short of it), and
//! the address's next connections wait unread, the first strike for
//! [`FIRST_WAIT`], each further one twice as long, up to
//! `[server] abuse_penalty`. A connection that waited is then served like
//! any other: a client that shares its address with an abuser (behind a NAT
//! or a proxy) is slowed, not refused. Waiting connections hold their slot
//! of `max_connections`, as a connection whose head has not arrived does
//! (for `header_read_timeout`): closing them at once instead was measured to
//! turn a flood into a loop of connects and closes, which cost the clients
//! beside it more than the flood had. Strikes are forgotten once
//! [`FORGET_AFTER_PENALTIES`] times `abuse_penalty` has passed since the
//! address's last wait ended without a new one.
//!
//! An address is an IPv4 address or an IPv6 /64 (what one host is usually
//! given); an IPv4 address mapped into IPv6 counts as the IPv4 address.
//!
//! At most [`MAX_ADDRESSES`] addresses are remembered: past that an
//! address's strike is not recorded (the map never grows without bound).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::connection::{Ended, REFUSALS_IN_A_ROW};

/// How long the next connection of an address waits after its first strike.
pub const FIRST_WAIT: Duration = Duration::from_millis(250);
/// Addresses remembered at once.
pub const MAX_ADDRESSES: usize = 4096;
/// Strikes are forgotten after this many of the longest penalty without one.
pub const FORGET_AFTER_PENALTIES: u32 = 4;

/// What one address has earned.
#[derive(Debug)]
struct Record {
    strikes: u32,
    /// Its next connections wait until then.
    until: Instant,
    /// Refusals in a row at the end of its connections that closed without
    /// a strike: a client that closes each just short of the run is struck
    /// once they add up to one.
    refusals: u32,
}

/// The addresses struck, shared by the proxy listener's connections.
#[derive(Debug)]
pub struct Penalties {
    longest: Duration,
    records: dashmap::DashMap<IpAddr, Record, ahash::RandomState>,
}

impl Penalties {
    /// Penalties up to `longest`; zero turns them off.
    pub fn new(longest: Duration) -> Arc<Penalties> {
        Arc::new(Penalties { longest, records: Default::default() })
    }

    /// A connection of `address`'s ended as `ended`: whether that struck
    /// the address.
    pub fn ended(&self, address: IpAddr, ended: Ended) -> bool {
        let address = host(address);
        match ended {
            Ended::Abused => {
                self.strike(address);
                true
            }
            Ended::Closed { refusals: 0 } => {
                if let Some(mut record) = self.records.get_mut(&address) {
                    record.refusals = 0;
                }
                false
            }
            Ended::Closed { refusals } => {
                if self.longest.is_zero() {
                    return false;
                }
                let Some(mut record) = self.record(address) else { return false };
                record.refusals = record.refusals.saturating_add(refusals);
                if record.refusals < REFUSALS_IN_A_ROW {
                    return false;
                }
                drop(record);
                self.strike(address);
                true
            }
        }
    }

    /// The record of `address`, made if there is room.
    fn record(&self, address: IpAddr) -> Option<dashmap::mapref::one::RefMut<'_, IpAddr, Record>> {
        let now = Instant::now();
        if self.records.len() >= MAX_ADDRESSES && !self.records.contains_key(&address) {
            self.forget_old(now);
            if self.records.len() >= MAX_ADDRESSES {
                crate::telemetry::warn_limited!(
                    addresses = MAX_ADDRESSES,
                    "too many addresses struck for abuse at once: this one is not held back"
                );
                return None;
            }
        }
        Some(self.records.entry(address).or_insert(Record { strikes: 0, until: now, refusals: 0 }))
    }

    /// A connection of `address`'s (already a host: [`host`]) was closed for
    /// abuse.
    fn strike(&self, address: IpAddr) {
        if self.longest.is_zero() {
            return;
        }
        let now = Instant::now();
        let Some(mut record) = self.record(address) else { return };
        record.refusals = 0;
        if now.saturating_duration_since(record.until) > self.longest * FORGET_AFTER_PENALTIES {
            record.strikes = 0;
        }
        record.strikes = record.strikes.saturating_add(1);
        let wait = FIRST_WAIT.saturating_mul(1 << (record.strikes - 1).min(16)).min(self.longest);
        record.until = now + wait;
    }

    /// Until when a new connection from `address` waits before it is
    /// served; `None`: not at all.
    pub fn wait(&self, address: IpAddr) -> Option<Instant> {
        if self.longest.is_zero() {
            return None;
        }
        let until = self.records.get(&host(address))?.until;
        (until > Instant::now()).then_some(until)
    }

    /// Drops the records whose strikes would be forgotten anyway.
    fn forget_old(&self, now: Instant) {
        let forget = self.longest * FORGET_AFTER_PENALTIES;
        self.records.retain(|_, r| now.saturating_duration_since(r.until) <= forget);
    }

    /// Addresses remembered now (for tests).
    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.records.len()
    }
}

/// The address a client is held back by: an IPv4 address (also one mapped
/// into IPv6), or the /64 of an IPv6 address.
fn host(address: IpAddr) -> IpAddr {
    match address.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn ip(n: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n))
    }

    fn wait(until: Option<Instant>) -> Option<Duration> {
        until.map(|until| until - Instant::now())
    }

    #[tokio::test(start_paused = true)]
    async fn each_strike_doubles_the_wait_up_to_the_longest_and_others_are_untouched() {
        let p = Penalties::new(Duration::from_secs(2));
        assert!(wait(p.wait(ip(1))).is_none());
        let mut expected = FIRST_WAIT;
        for _ in 0..6 {
            p.strike(ip(1));
            assert_eq!(wait(p.wait(ip(1))), Some(expected));
            expected = (expected * 2).min(Duration::from_secs(2));
        }
        assert!(wait(p.wait(ip(2))).is_none(), "another address waits for nothing");
        // Once its penalty has passed, the address is served at once again.
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(wait(p.wait(ip(1))).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn strikes_are_kept_through_quiet_penalties_then_forgotten() {
        let p = Penalties::new(Duration::from_secs(1));
        for _ in 0..3 {
            p.strike(ip(1));
        }
        // The third strike's wait (1 s) ends, then almost the whole window.
        tokio::time::advance(Duration::from_secs(1) + Duration::from_secs(1) * FORGET_AFTER_PENALTIES).await;
        p.strike(ip(1));
        assert_eq!(wait(p.wait(ip(1))), Some(Duration::from_secs(1)), "kept: the wait stays at its longest");
        tokio::time::advance(Duration::from_secs(1) + Duration::from_secs(1) * FORGET_AFTER_PENALTIES).await;
        tokio::time::advance(Duration::from_millis(1)).await;
        p.strike(ip(1));
        assert_eq!(wait(p.wait(ip(1))), Some(FIRST_WAIT), "forgotten: back to the first wait");
    }

    #[tokio::test(start_paused = true)]
    async fn refusals_at_the_end_of_closed_connections_add_up_to_a_strike() {
        let p = Penalties::new(Duration::from_secs(1));
        let closed = |refusals| Ended::Closed { refusals };
        // A client closing each connection just short of the run.
        assert!(!p.ended(ip(1), closed(REFUSALS_IN_A_ROW - 1)));
        assert!(wait(p.wait(ip(1))).is_none());
        assert!(p.ended(ip(1), closed(1)), "the run, over two connections");
        assert_eq!(wait(p.wait(ip(1))), Some(FIRST_WAIT));
        // A connection whose last answer served a request starts the count again.
        tokio::time::advance(FIRST_WAIT).await;
        assert!(!p.ended(ip(1), closed(REFUSALS_IN_A_ROW - 1)));
        assert!(!p.ended(ip(1), closed(0)));
        assert!(!p.ended(ip(1), closed(REFUSALS_IN_A_ROW - 1)));
        assert!(wait(p.wait(ip(1))).is_none());
        assert!(p.ended(ip(2), Ended::Abused));
    }

    #[tokio::test(start_paused = true)]
    async fn an_ipv6_slash_64_is_one_address_and_a_mapped_ipv4_is_the_ipv4() {
        let p = Penalties::new(Duration::from_secs(1));
        let v6 = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(p.ended(v6("2001:db8:1:2::1"), Ended::Abused));
        assert!(wait(p.wait(v6("2001:db8:1:2:ffff::9"))).is_some(), "same /64");
        assert!(wait(p.wait(v6("2001:db8:1:3::1"))).is_none(), "another /64");
        assert!(p.ended(v6("::ffff:10.0.0.7"), Ended::Abused));
        assert!(wait(p.wait(ip(7))).is_some(), "the IPv4 address behind the mapped one");
        assert!(wait(p.wait(ip(8))).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn off_at_zero_and_the_map_is_bounded() {
        let off = Penalties::new(Duration::ZERO);
        off.strike(ip(1));
        assert!(wait(off.wait(ip(1))).is_none());
        assert_eq!(off.remembered(), 0);

        let p = Penalties::new(Duration::from_secs(1));
        for n in 0..MAX_ADDRESSES as u32 + 10 {
            p.strike(ip(n));
        }
        assert_eq!(p.remembered(), MAX_ADDRESSES);
        // Old records make room for new ones.
        tokio::time::advance(Duration::from_secs(1) * (FORGET_AFTER_PENALTIES + 1)).await;
        p.strike(ip(1_000_000));
        assert_eq!(p.remembered(), 1);
        assert!(wait(p.wait(ip(1_000_000))).is_some());
    }
}
