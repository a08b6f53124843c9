//! The unprepared statements of pooled mode: the simple query protocol, with values
//! written inline as literals.

use std::sync::Arc;

use sea_orm::{DatabaseConnection, DbErr, QueryResult, RuntimeErr};

/// One statement over the simple query protocol: no Parse, no Bind, nothing prepared. The
/// only way a statement survives a transaction-mode pooler such as PgBouncer 1.18, which
/// may hand the Bind to another server than the Parse (sqlx prepares every statement, even
/// unnamed ones, in a round trip of its own). `sql` carries its values inline (see
/// [`inline_values`]). PostgreSQL only.
///
/// Each goes after an `UNLISTEN *`, in the same implicit transaction. A server connection of a
/// pooler may still LISTEN for another client (an older machine, another app) that is long
/// gone; our own trigger's NOTIFY would then be delivered to us at the commit, and the driver
/// would fail a statement that has committed. Unlistening in the same transaction means
/// nothing is delivered; on a connection that listens for nothing it costs nothing.
pub(crate) async fn query_simple(db: &DatabaseConnection, sql: String) -> Result<Vec<QueryResult>, DbErr> {
    let pool = db.get_postgres_connection_pool();
    let rows = sea_orm::sqlx::raw_sql(sea_orm::sqlx::AssertSqlSafe(format!("UNLISTEN *; {sql}")))
        .fetch_all(pool)
        .await
        .map_err(|e| DbErr::Query(RuntimeErr::SqlxError(Arc::new(e))))?;
    Ok(rows.into_iter().map(QueryResult::from).collect())
}

/// [`query_simple`] for a statement whose rows are not wanted: how many it touched.
pub(crate) async fn exec_simple(db: &DatabaseConnection, sql: String) -> Result<u64, DbErr> {
    let pool = db.get_postgres_connection_pool();
    let done = sea_orm::sqlx::raw_sql(sea_orm::sqlx::AssertSqlSafe(format!("UNLISTEN *; {sql}")))
        .execute(pool)
        .await
        .map_err(|e| DbErr::Exec(RuntimeErr::SqlxError(Arc::new(e))))?;
    Ok(done.rows_affected())
}

/// Writes each `$n` of `sql` as the SQL literal of `values[n - 1]`. A `$n` inside a quoted
/// literal or identifier, a comment or a dollar-quoted body, or right after an identifier
/// character, is not a placeholder and is left alone, as is one with no value. Our
/// statements are written with `$n` for every value, so a value never becomes SQL text.
pub(crate) fn inline_values(sql: &str, values: &[sea_orm::Value]) -> String {
    let b = sql.as_bytes();
    let mut out = String::with_capacity(sql.len() + 16 * values.len());
    let (mut i, mut copied) = (0, 0);
    while i < b.len() {
        i = match b[i] {
            q @ (b'\'' | b'"') => sql[i + 1..].find(q as char).map_or(b.len(), |e| i + 1 + e + 1),
            b'-' if b.get(i + 1) == Some(&b'-') => sql[i..].find('\n').map_or(b.len(), |e| i + e),
            b'/' if b.get(i + 1) == Some(&b'*') => sql[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2),
            b'$' if i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_') => i + 1,
            b'$' if b.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                let end = i + 1 + b[i + 1..].iter().take_while(|d| d.is_ascii_digit()).count();
                if let Some(v) = sql[i + 1..end].parse::<usize>().ok().and_then(|n| values.get(n.wrapping_sub(1))) {
                    out.push_str(&sql[copied..i]);
                    write_literal(&mut out, v);
                    copied = end;
                }
                end
            }
            b'$' => dollar_quote_end(sql, i),
            _ => i + 1,
        };
    }
    out.push_str(&sql[copied..]);
    out
}

/// Where the dollar-quoted string that starts at `start` (`$$…$$` or `$tag$…$tag$`) ends;
/// just past the `$` if none starts there.
fn dollar_quote_end(sql: &str, start: usize) -> usize {
    let rest = &sql[start + 1..];
    let tag_len = rest.find('$').filter(|&n| rest[..n].bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_'));
    let Some(n) = tag_len else { return start + 1 };
    let tag = &sql[start..start + n + 2];
    let body = start + tag.len();
    sql[body..].find(tag).map_or(sql.len(), |e| body + e + tag.len())
}

/// A value as a PostgreSQL literal. Text (and JSON, as text) is written `E'…'` with both
/// backslashes and quotes doubled: correct whatever `standard_conforming_strings` and
/// `backslash_quote` are. The rest is sea-query's PostgreSQL writer (numbers, booleans, NULL).
fn write_literal(out: &mut String, v: &sea_orm::Value) {
    use sea_orm::sea_query::{PostgresQueryBuilder, QueryBuilder};
    let text = match v {
        sea_orm::Value::String(Some(s)) => s.clone(),
        sea_orm::Value::Json(Some(j)) => j.to_string(),
        other => return out.push_str(&PostgresQueryBuilder.value_to_string(other)),
    };
    out.push_str("E'");
    out.push_str(&text.replace('\\', "\\\\").replace('\'', "''"));
    out.push('\'');
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values are written in as escaped literals; a `$` inside a quoted literal or identifier,
    /// and a placeholder with no value, are left as they are.
    #[test]
    fn inline_values_quotes_and_escapes() {
        let values = [sea_orm::Value::from("it's"), sea_orm::Value::from(7i64), sea_orm::Value::from(None::<String>)];
        let sql = inline_values("SELECT $1, $2, '$1', \"$2\", $3, $4, $20, a$1", &values);
        assert_eq!(sql, "SELECT E'it''s', 7, '$1', \"$2\", NULL, $4, $20, a$1");
        let back = inline_values("SELECT $1", &[sea_orm::Value::from("a\\b'; DROP TABLE x; --")]);
        assert_eq!(back, "SELECT E'a\\\\b''; DROP TABLE x; --'");
        let hidden = inline_values("SELECT 1 -- $1\n, $2 /* $1 */, $$ $1 $$, $q$ $1 $q$", &values);
        assert_eq!(hidden, "SELECT 1 -- $1\n, 7 /* $1 */, $$ $1 $$, $q$ $1 $q$");
    }
}
