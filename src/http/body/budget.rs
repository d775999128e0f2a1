//! The bytes buffered fenced bodies may hold: the process's budget and one
//! connection's share of it, taken together or not at all.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A budget for buffered fenced bodies, in bytes: the process-wide one, or
/// one connection's share of it.
#[derive(Debug)]
pub struct BufferBudget {
    used: AtomicU64,
    limit: u64,
}

impl BufferBudget {
    pub fn new(limit: u64) -> Arc<Self> {
        Arc::new(BufferBudget { used: AtomicU64::new(0), limit })
    }

    /// Bytes held now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Takes `bytes`, or says the budget (its limit) is spent.
    fn reserve(&self, bytes: u64) -> Result<(), u64> {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let next = used.checked_add(bytes).filter(|n| *n <= self.limit).ok_or(self.limit)?;
            match self.used.compare_exchange_weak(used, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(now) => used = now,
            }
        }
    }

    fn release(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// A budget had no room for a body's next bytes: which one, and its limit.
/// Kept apart from the request path's errors so the budget depends on none
/// of them; the layer turns it into a 503.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BudgetFull {
    /// The process's budget, shared by every connection.
    #[error("the process's budget of {0} bytes for buffered bodies is spent")]
    Process(u64),
    /// The share of it one client connection may hold.
    #[error("the connection's share of {0} bytes for buffered bodies is spent")]
    Connection(u64),
}

/// Bytes one body took from its connection's share and from the process's
/// budget; handed back to both when dropped.
#[derive(Debug)]
pub struct Held {
    global: Arc<BufferBudget>,
    connection: Arc<BufferBudget>,
    bytes: u64,
}

impl Held {
    pub fn new(global: &Arc<BufferBudget>, connection: &Arc<BufferBudget>) -> Self {
        Held { global: global.clone(), connection: connection.clone(), bytes: 0 }
    }

    /// Takes `bytes` more from both budgets, or from neither. The
    /// connection's share is asked first, so one connection at its share
    /// never touches the budget the others share.
    pub fn take(&mut self, bytes: u64) -> Result<(), BudgetFull> {
        self.connection.reserve(bytes).map_err(BudgetFull::Connection)?;
        if let Err(limit) = self.global.reserve(bytes) {
            self.connection.release(bytes);
            return Err(BudgetFull::Process(limit));
        }
        self.bytes += bytes;
        Ok(())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.global.release(self.bytes);
        self.connection.release(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_takes_from_its_connection_share_and_the_budget_or_from_neither() {
        let budget = BufferBudget::new(100);
        let (one, other) = (BufferBudget::new(60), BufferBudget::new(60));
        let mut a = Held::new(&budget, &one);
        a.take(50).unwrap();
        // The connection's share runs out first, and the budget is untouched.
        let mut b = Held::new(&budget, &one);
        assert_eq!(b.take(20), Err(BudgetFull::Connection(60)));
        assert_eq!((budget.used(), one.used()), (50, 50));
        // Another connection has a share of its own, but the budget is shared:
        // a refusal there hands the share back.
        let mut c = Held::new(&budget, &other);
        c.take(50).unwrap();
        let mut d = Held::new(&budget, &other);
        assert_eq!(d.take(5), Err(BudgetFull::Process(100)));
        assert_eq!((budget.used(), other.used()), (100, 50));
        drop((a, b, c, d));
        assert_eq!((budget.used(), one.used(), other.used()), (0, 0, 0));
    }
}
