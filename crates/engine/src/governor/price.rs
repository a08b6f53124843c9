//! What a model's tokens cost, in USD per million tokens: a small table taken from LiteLLM's
//! (`prices.json`, whose origin `PRICES.md` gives), which a machine's `[limits.prices]`
//! overrides or extends. Only a CLI that prints no cost of its own (codex, gemini; claude
//! until its result) is priced by it, so an estimate is only as good as this table: a
//! model it does not know is said to be unknown rather than guessed free.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use serde::{Deserialize, Serialize};

/// USD per million tokens of each kind.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(from = "PriceEntry")]
pub struct Price {
    pub input: f64,
    pub output: f64,
    /// Input written to the prompt cache (Anthropic bills it above plain input).
    pub cache_write: f64,
    /// Input read from the prompt cache.
    pub cache_read: f64,
}

/// A price as written: a provider with no separate cache price bills cached input as input,
/// so the cache prices may be left out. Unknown keys are refused (a misspelt `ouput` would
/// otherwise price output at nothing).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PriceEntry {
    input: f64,
    output: f64,
    cache_write: Option<f64>,
    cache_read: Option<f64>,
}

impl From<PriceEntry> for Price {
    fn from(e: PriceEntry) -> Self {
        Price {
            input: e.input,
            output: e.output,
            cache_write: e.cache_write.unwrap_or(e.input),
            cache_read: e.cache_read.unwrap_or(e.input),
        }
    }
}

/// Tokens of one call or of a whole run, by kind. `input` is the uncached part only: a CLI
/// that counts cached input inside its input total (codex, gemini) is split when read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tokens {
    pub input: i64,
    pub output: i64,
    pub cache_write: i64,
    pub cache_read: i64,
}

impl Tokens {
    /// Everything sent to the model: plain, cache-written and cache-read input.
    pub fn sent(&self) -> i64 {
        self.input.saturating_add(self.cache_write).saturating_add(self.cache_read)
    }

    pub fn is_zero(&self) -> bool {
        *self == Tokens::default()
    }

    /// Adds `other`, saturating: the counts come from the agent's output, which may say
    /// anything (an overflow would panic in a debug build and turn negative in a release).
    pub fn add(&mut self, other: &Tokens) {
        self.input = self.input.saturating_add(other.input);
        self.output = self.output.saturating_add(other.output);
        self.cache_write = self.cache_write.saturating_add(other.cache_write);
        self.cache_read = self.cache_read.saturating_add(other.cache_read);
    }
}

impl Price {
    /// What `tokens` cost at this price, in USD.
    pub fn cost(&self, t: &Tokens) -> f64 {
        let micro = t.input as f64 * self.input
            + t.output as f64 * self.output
            + t.cache_write as f64 * self.cache_write
            + t.cache_read as f64 * self.cache_read;
        micro / 1_000_000.0
    }

    /// Every figure finite and not negative.
    pub fn is_valid(&self) -> bool {
        [self.input, self.output, self.cache_write, self.cache_read].iter().all(|p| p.is_finite() && *p >= 0.0)
    }
}

/// The vendored table. A test proves it parses; were it ever broken, every model would be
/// unknown, never free.
static TABLE: LazyLock<BTreeMap<String, Price>> =
    LazyLock::new(|| serde_json::from_str(include_str!("prices.json")).unwrap_or_default());

/// The vendored table (`prices.json`), by model name.
pub fn table() -> &'static BTreeMap<String, Price> {
    &TABLE
}

/// The price of `model`: `overrides` (the machine's `[limits.prices]`) first, then the
/// vendored table. The exact name; else the name without a provider path (`anthropic/`)
/// and a date (`-20250929`, `@20250929`, `-2025-08-07`), compared with the tables' names
/// stripped alike; else the longest name the model's starts with, followed by `-`
/// (`gpt-5-codex-high` is priced as `gpt-5-codex`). A `-` boundary keeps `gpt-5.2` from
/// being priced as `gpt-5`; a new version of a family (`claude-opus-4-7`) may still be
/// priced as an older one (`claude-opus-4`), which an override corrects. `None`: unknown.
pub fn price_of(model: &str, overrides: &BTreeMap<String, Price>) -> Option<Price> {
    let model = model.trim();
    if model.is_empty() {
        return None;
    }
    let tables = [overrides, table()];
    if let Some(p) = tables.iter().find_map(|t| t.get(model)) {
        return Some(*p);
    }
    let base = undated(model.rsplit('/').next().unwrap_or(model));
    let named = |t: &&BTreeMap<String, Price>| t.iter().find(|(n, _)| undated(n) == base).map(|(_, p)| *p);
    if let Some(p) = tables.iter().find_map(named) {
        return Some(p);
    }
    let mut best: Option<(usize, Price)> = None;
    for (name, price) in tables.iter().flat_map(|t| t.iter()) {
        let name = undated(name);
        let variant = base.strip_prefix(name).is_some_and(|rest| rest.starts_with('-'));
        // Strictly longer: on a tie the override, seen first, stays.
        if variant && best.is_none_or(|(len, _)| name.len() > len) {
            best = Some((name.len(), *price));
        }
    }
    best.map(|(_, p)| p)
}

/// `name` without a trailing date: `-YYYYMMDD`, `@YYYYMMDD` or `-YYYY-MM-DD`.
fn undated(name: &str) -> &str {
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    let b = name.as_bytes();
    let n = name.len();
    if n > 9 && matches!(b[n - 9], b'-' | b'@') && digits(&name[n - 8..]) && name[n - 8..].starts_with("20") {
        return &name[..n - 9];
    }
    let dashed = n > 11
        && b[n - 11] == b'-'
        && b[n - 6] == b'-'
        && b[n - 3] == b'-'
        && digits(&name[n - 10..n - 6])
        && digits(&name[n - 5..n - 3])
        && digits(&name[n - 2..]);
    if dashed && name[n - 10..].starts_with("20") {
        return &name[..n - 11];
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none() -> BTreeMap<String, Price> {
        BTreeMap::new()
    }

    /// The vendored table parses, holds every family the CLIs use, and each price is valid.
    #[test]
    fn the_table_parses() {
        let t = table();
        assert!(t.len() >= 30, "{}", t.len());
        for m in ["claude-sonnet-4-5", "claude-opus-4-5", "claude-haiku-4-5", "gpt-5", "gpt-5-codex", "o4-mini"] {
            assert!(t.contains_key(m), "{m}");
        }
        assert!(t.contains_key("gemini-2.5-pro") && t.contains_key("gemini-2.5-flash"));
        assert!(t.values().all(Price::is_valid));
        assert_eq!(t["claude-sonnet-4-5"], Price { input: 3.0, output: 15.0, cache_write: 3.75, cache_read: 0.3 });
    }

    /// A dated name is priced as its family; a provider path is dropped; a variant takes its
    /// longest base; a name that only shares digits with a family is unknown.
    #[test]
    fn names_are_matched_with_care() {
        let p = |m: &str| price_of(m, &none()).map(|p| (p.input, p.output));
        assert_eq!(p("claude-sonnet-4-5-20250929"), Some((3.0, 15.0)));
        assert_eq!(p("claude-sonnet-4-5@20250929"), Some((3.0, 15.0)));
        assert_eq!(p("anthropic/claude-haiku-4-5-20251001"), Some((1.0, 5.0)));
        assert_eq!(p("claude-opus-4-20250514"), Some((15.0, 75.0)));
        assert_eq!(p("claude-opus-4-5-20251101"), Some((5.0, 25.0)), "not opus 4's price");
        assert_eq!(p("claude-sonnet-4"), Some((3.0, 15.0)), "the table's dated name, undated");
        assert_eq!(p("gpt-5-2025-08-07"), Some((1.25, 10.0)));
        assert_eq!(p("gpt-5.1-codex-mini"), Some((0.25, 2.0)), "exact beats the shorter base");
        assert_eq!(p("gpt-5-codex-high"), Some((1.25, 10.0)), "a variant is priced as its base");
        assert_eq!(p("gpt-5.2"), Some((1.75, 14.0)), "not gpt-5's price");
        assert_eq!(p("gpt-5.3"), None, "a `.` is no variant boundary");
        assert_eq!(p("claude-sonnet-4-50"), Some((3.0, 15.0)), "priced as claude-sonnet-4, never 4-5");
        assert_eq!(p("o3x"), None);
        assert_eq!(p("llama-3"), None);
        assert_eq!(p(""), None);
    }

    /// An override wins over the table and adds models it lacks; cache prices left out are
    /// the input price.
    #[test]
    fn overrides_win() {
        let overrides: BTreeMap<String, Price> =
            toml::from_str("[\"claude-sonnet-4-5\"]\ninput = 1.0\noutput = 2.0\n[my-model]\ninput = 4\noutput = 8\n")
                .unwrap();
        let p = price_of("claude-sonnet-4-5-20250929", &overrides).unwrap();
        assert_eq!((p.input, p.output, p.cache_read), (1.0, 2.0, 1.0));
        assert_eq!(price_of("my-model", &overrides).unwrap().cache_write, 4.0);
        assert_eq!(price_of("gpt-5", &overrides).unwrap().input, 1.25, "the table still answers");
        let family: BTreeMap<String, Price> = toml::from_str("[claude-sonnet-4]\ninput = 9\noutput = 9\n").unwrap();
        assert_eq!(price_of("claude-sonnet-4-5", &family).unwrap().input, 3.0, "an exact name beats a family");
        assert_eq!(price_of("claude-sonnet-4-7", &family).unwrap().input, 9.0, "the override's family wins");
        assert!(toml::from_str::<BTreeMap<String, Price>>("[m]\ninput = 1.0\nouput = 2.0\n").is_err());
    }

    /// The cost is each kind of token at its own price, per million.
    #[test]
    fn cost_is_per_million_by_kind() {
        let p = price_of("claude-sonnet-4-5", &none()).unwrap();
        let t = Tokens { input: 1_000_000, output: 100_000, cache_write: 200_000, cache_read: 2_000_000 };
        let want = 3.0 + 1.5 + 0.75 + 0.6;
        assert!((p.cost(&t) - want).abs() < 1e-9, "{}", p.cost(&t));
        assert_eq!(t.sent(), 3_200_000);
        assert_eq!(p.cost(&Tokens::default()), 0.0);
    }
}
