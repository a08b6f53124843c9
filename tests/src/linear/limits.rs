//! Linear's rate limits for an API key: 1,500 requests and 250,000 complexity points an hour,
//! reported on every answer in `X-RateLimit-*` headers (reset times in epoch milliseconds) and
//! `X-Complexity` (this request's cost). An exhausted budget is refused until its reset.

/// Linear's hourly window.
const WINDOW_MS: i64 = 3_600_000;
/// Requests an hour for an API key.
pub(crate) const REQUEST_LIMIT: u64 = 1_500;
/// Complexity points an hour for an API key.
pub(crate) const COMPLEXITY_LIMIT: u64 = 250_000;

/// One budget: what is left until `reset_ms`, when it is full again.
#[derive(Debug, Clone)]
pub(crate) struct Budget {
    limit: u64,
    remaining: u64,
    reset_ms: i64,
}

impl Budget {
    /// A full budget whose window starts now.
    fn new(limit: u64, now: i64) -> Self {
        Self { limit, remaining: limit, reset_ms: now + WINDOW_MS }
    }

    /// Refills the budget if its window has passed.
    fn refresh(&mut self, now: i64) {
        if now >= self.reset_ms {
            self.remaining = self.limit;
            self.reset_ms = now + WINDOW_MS;
        }
    }

    /// Sets what is left and when it refills (the tests' lever).
    pub(crate) fn set(&mut self, remaining: u64, reset_ms: i64) {
        self.remaining = remaining.min(self.limit);
        self.reset_ms = reset_ms;
    }
}

/// The key's two budgets.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    pub requests: Budget,
    pub complexity: Budget,
}

impl Limits {
    /// Both budgets full.
    pub(crate) fn new(now: i64) -> Self {
        Self { requests: Budget::new(REQUEST_LIMIT, now), complexity: Budget::new(COMPLEXITY_LIMIT, now) }
    }

    /// Takes one request from the budget, or `false` when either budget is exhausted.
    pub(crate) fn admit(&mut self, now: i64) -> bool {
        self.requests.refresh(now);
        self.complexity.refresh(now);
        if self.requests.remaining == 0 || self.complexity.remaining == 0 {
            return false;
        }
        self.requests.remaining -= 1;
        true
    }

    /// Charges a request's complexity.
    pub(crate) fn charge(&mut self, points: u64) {
        self.complexity.remaining = self.complexity.remaining.saturating_sub(points);
    }

    /// The headers Linear sends, `complexity` being this request's cost (0 when it was not
    /// run).
    pub(crate) fn headers(&self, complexity: u64) -> Vec<(String, String)> {
        let (r, c) = (&self.requests, &self.complexity);
        [
            ("X-RateLimit-Requests-Limit", r.limit.to_string()),
            ("X-RateLimit-Requests-Remaining", r.remaining.to_string()),
            ("X-RateLimit-Requests-Reset", r.reset_ms.to_string()),
            ("X-Complexity", complexity.to_string()),
            ("X-RateLimit-Complexity-Limit", c.limit.to_string()),
            ("X-RateLimit-Complexity-Remaining", c.remaining.to_string()),
            ("X-RateLimit-Complexity-Reset", c.reset_ms.to_string()),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_string(), value))
        .collect()
    }
}
