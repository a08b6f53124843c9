//! The governor's building blocks: what a fleet of machines may spend on its agents, and
//! which account a usage limit holds (issue 42). Everything here is pure (settings, names,
//! prices, sums and verdicts) or reads only this machine's files, so the parts that touch
//! the shared database and the running agents stay small and these stay tested alone.
//!
//! Spend is counted per job, per calendar day of the fleet, and per account per day; a
//! usage limit that one machine hits holds every machine that runs as the same account.

// # Layout
// - `settings.rs`: the `[limits]` table: caps, the fleet's day, holds, price overrides.
// - `account.rs`: which account a preset runs as here, named the same on every machine.
// - `price.rs` (+ `prices.json`, `PRICES.md`): USD per million tokens, per model.
// - `meter.rs`: a running agent's spend, read from its streamed output as it comes.
// - `budget.rs`: the decisions: the day's bounds, caps judged, how long a hold lasts.

pub mod account;
pub mod budget;
pub mod meter;
pub mod price;
pub mod settings;

pub use account::{account_of, Account};
pub use budget::{clock_of, day_bounds, Cap, Caps, Spending, Verdict};
pub use jiff::tz::TimeZone;
pub use meter::{Meter, Source, Spent, Tail};
pub use price::{price_of, Price, Tokens};
pub use settings::LimitSettings;
