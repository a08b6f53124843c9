//! The report's number helpers, shared by [`crate::report`] and [`crate::report_peers`].

use serde_json::Value;

pub(crate) fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

pub(crate) fn rows(v: &Value) -> Vec<Value> {
    v.as_array().cloned().unwrap_or_default()
}

/// (a) at `claimers` clients; 128 uses the highest measured (32).
pub(crate) fn limit_at(j: &Value, claimers: u64) -> f64 {
    let a = rows(&j["a"]);
    a.iter()
        .find(|r| r["claimers"].as_u64() == Some(claimers))
        .or_else(|| a.last())
        .map(|r| f(&r["claims_per_s"]))
        .unwrap_or(f64::NAN)
}

pub(crate) fn find(v: &[Value], claimers: u64, procs: u64, batched: bool) -> Option<&Value> {
    v.iter().find(|r| {
        r["claimers"].as_u64() == Some(claimers)
            && r["processes"].as_u64() == Some(procs)
            && r["batched"].as_bool() == Some(batched)
    })
}

pub(crate) fn n0(x: f64) -> String {
    if x.is_nan() {
        return "n/a".into();
    }
    let s = format!("{:.0}", x);
    // thousands separators
    let (neg, digits) = s.strip_prefix('-').map(|d| (true, d)).unwrap_or((false, &s));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if neg {
        format!("-{out}")
    } else {
        out
    }
}
