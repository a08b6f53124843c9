//! The machine's counters, shared by its parts and read through the [`super::Handle`].

use std::sync::atomic::AtomicU64;

/// Counters that tests and the benchmark read.
#[derive(Debug, Default)]
pub struct Stats {
    pub polls: AtomicU64,
    pub claim_queries: AtomicU64,
    /// Times the throttled sweep was due: a sweep statement, or (PostgreSQL) a stale-lease
    /// test folded into a poll that decides whether a sweep statement follows.
    pub sweep_checks: AtomicU64,
    /// Sweep statements sent.
    pub sweeps: AtomicU64,
    pub sweep_failures: AtomicU64,
    pub presence_writes: AtomicU64,
    pub heartbeats: AtomicU64,
    /// Times the lease keeper woke to look at its deadlines (only while it holds a lease).
    pub lease_ticks: AtomicU64,
    pub lost_races: AtomicU64,
    /// Completions written by the poll that filled their slot ([`super::runner::Rider`]).
    pub completions_carried: AtomicU64,
}
