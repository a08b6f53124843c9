//! [`Fence`]: one claim of one job, which every write after the claim names.

use sea_orm::{FromQueryResult, Value};
use serde::Serialize;

use super::dialect::Dialect;

/// One claim of a job: the job's id and the `claim_token` that claim set. Every write after a
/// claim names its fence, and matches `(id, claim_token)` in its WHERE: every claim increments
/// the token, so a machine that slept through losing its lease cannot write. Decoded from the
/// `id` and `claim_token` columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, FromQueryResult)]
pub struct Fence {
    /// The job's id.
    #[sea_orm(alias = "id")]
    pub job: i64,
    /// The claim token of this claim of it.
    #[sea_orm(alias = "claim_token")]
    pub token: i64,
}

impl std::fmt::Display for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "#{} (claim {})", self.job, self.token)
    }
}

/// `($1, $2), ($3, $4), …` for a list of fences, in `d`'s parameters, numbered after
/// `offset`; the values to bind.
pub(super) fn pair_list(d: &Dialect, fences: &[Fence], offset: usize) -> (String, Vec<Value>) {
    let mut sql = String::with_capacity(fences.len() * 12);
    let mut values = Vec::with_capacity(fences.len() * 2);
    for (i, f) in fences.iter().enumerate() {
        if i > 0 {
            sql.push_str(", ");
        }
        let n = offset + values.len();
        sql.push_str(&format!("({}, {})", d.p(n + 1), d.p(n + 2)));
        values.push(f.job.into());
        values.push(f.token.into());
    }
    (sql, values)
}

#[cfg(test)]
mod tests {
    use super::super::dialect::{POSTGRES, SQLITE};
    use super::*;

    /// Pairs are numbered after the offset, in the backend's parameters; fences order by job.
    #[test]
    fn pairs_and_order() {
        let fences = [Fence { job: 4, token: 2 }, Fence { job: 9, token: 1 }];
        let (sql, values) = pair_list(&POSTGRES, &fences, 1);
        assert_eq!((sql.as_str(), values.len()), ("($2, $3), ($4, $5)", 4));
        assert_eq!(pair_list(&SQLITE, &fences[..1], 0).0, "(?1, ?2)");
        assert!(fences[0] < fences[1]);
        assert_eq!(fences[0].to_string(), "#4 (claim 2)");
    }
}
