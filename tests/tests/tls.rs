//! TLS to PostgreSQL, on real processes: a throwaway cluster with `ssl=on` presents a
//! certificate for `localhost` from a private CA that the harness makes with openssl. Where a
//! connection is accepted, the server's `pg_stat_ssl` must show that session encrypted.

// A test says "this must hold" by unwrapping: a panic is its failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};

use devpilot_tests::tls::tls_pg;
use devpilot_tests::{devpilot, run_cli, shared_pg};

/// A new database of its own on the TLS cluster (tests that migrate must not share one),
/// at `host`, with these query parameters.
fn url(host: &str, params: &str) -> String {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let (pg, _) = tls_pg();
    let name = format!("tls_{}_{}", std::process::id(), SEQ.fetch_add(1, Ordering::SeqCst));
    let admin = format!("{}?sslmode=disable", pg.url("postgres"));
    create_database(&admin, &name);
    format!("postgres://postgres:{}@{host}:{}/{name}?{params}", pg.password, pg.port)
}

/// `CREATE DATABASE name` over `admin` (on a thread of its own: the tests are synchronous).
fn create_database(admin: &str, name: &str) {
    let (admin, name) = (admin.to_string(), name.to_string());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            use sea_orm::ConnectionTrait;
            let u = devpilot_store::db::DbUrl::parse(&admin).unwrap();
            let c = devpilot_store::db::connect(&u, &devpilot_store::db::PoolSettings::default()).await.unwrap();
            c.execute_unprepared(&format!("CREATE DATABASE {name}")).await.unwrap();
        })
    })
    .join()
    .unwrap();
}

/// `devpilot migrate` with `url` (and extra environment): exit code and stderr.
fn migrate(url: &str, env: &[(&str, &str)]) -> (i32, String) {
    let home = tempfile::tempdir().unwrap();
    let mut c = devpilot(home.path(), url);
    c.arg("migrate").env_remove("SSL_CERT_FILE").env_remove("SSL_CERT_DIR");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!err.contains("panicked"), "no panic: {err}");
    (out.status.code().unwrap_or(-1), err)
}

/// The TLS state (`pg_stat_ssl.ssl`, `.version`) of every client session on database `name`
/// of the TLS cluster, read over a connection of its own to another database.
fn sessions_on(name: &str) -> Vec<(bool, Option<String>)> {
    let (pg, _) = tls_pg();
    let admin = format!("{}?sslmode=disable", pg.url("postgres"));
    let sql = format!(
        "SELECT s.ssl, s.version FROM pg_stat_ssl s JOIN pg_stat_activity a ON a.pid = s.pid \
          WHERE a.datname = '{name}' AND a.backend_type = 'client backend'"
    );
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            use sea_orm::ConnectionTrait;
            let u = devpilot_store::db::DbUrl::parse(&admin).unwrap();
            let c = devpilot_store::db::connect(&u, &devpilot_store::db::PoolSettings::default()).await.unwrap();
            let rows = c.query_all_raw(sea_orm::Statement::from_string(c.get_database_backend(), sql)).await.unwrap();
            rows.iter()
                .map(|r| (r.try_get::<bool>("", "ssl").unwrap(), r.try_get::<Option<String>>("", "version").unwrap()))
                .collect()
        })
    })
    .join()
    .unwrap()
}

/// With `url` (already migrated) a `devpilot claim --wait-stdin` holds its connection open at
/// `ready`: the server must see that session, and see it encrypted. Then the claim of a job
/// that does not exist runs and loses (exit 3), over the same connection.
fn assert_session_encrypted(url: &str, env: &[(&str, &str)]) {
    let name = url.split('?').next().unwrap().rsplit('/').next().unwrap().to_string();
    let home = tempfile::tempdir().unwrap();
    let mut c = devpilot(home.path(), url);
    c.args(["claim", "--orchestrator", "tls-check", "--machine", "tls-check", "--wait-stdin", "1"])
        .env_remove("SSL_CERT_FILE")
        .env_remove("SSL_CERT_DIR")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c.spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    if line.trim() != "ready" {
        let _ = child.kill();
        let mut err = String::new();
        let _ = child.stderr.take().unwrap().read_to_string(&mut err);
        panic!("the claim did not connect: {line:?} {err}");
    }
    let sessions = sessions_on(&name);
    child.stdin.take().unwrap().write_all(b"\n").unwrap();
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let code = child.wait().unwrap().code();
    assert!(!sessions.is_empty(), "the server sees the session on {name}");
    assert!(
        sessions.iter().all(|(ssl, v)| *ssl && v.as_deref().is_some_and(|v| v.starts_with("TLSv1."))),
        "pg_stat_ssl shows every session on {name} encrypted: {sessions:?}"
    );
    assert_eq!((code, rest.trim()), (Some(3), "lost 1"), "the claim ran over that session");
}

/// A refusal says the certificate was refused and why, never "cannot reach", and never
/// carries the password.
fn assert_refused(url: &str, why: &str, env: &[(&str, &str)]) {
    let (code, err) = migrate(url, env);
    assert_ne!(code, 0, "{url} must be refused");
    assert!(err.contains("the server's certificate was refused"), "says the certificate was refused: {err}");
    assert!(err.contains(why), "says why ({why}): {err}");
    assert!(!err.contains("cannot reach"), "not a network problem: {err}");
    assert!(!err.contains(&tls_pg().0.password), "no password in: {err}");
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// `sslmode=require` encrypts without checking the certificate: it connects (and migrates),
/// and the server sees the session encrypted.
#[test]
fn sslmode_require_connects() {
    let u = url("127.0.0.1", "sslmode=require");
    let (code, err) = migrate(&u, &[]);
    assert_eq!(code, 0, "{err}");
    assert_session_encrypted(&u, &[]);
}

/// `verify-full` with the server's CA as `sslrootcert`, to the name the certificate has; the
/// server sees the session encrypted.
#[test]
fn verify_full_with_the_servers_ca_connects() {
    let ca = path(&tls_pg().1.ca);
    let u = url("localhost", &format!("sslmode=verify-full&sslrootcert={ca}"));
    let (code, err) = migrate(&u, &[]);
    assert_eq!(code, 0, "{err}");
    assert_session_encrypted(&u, &[]);
}

/// `verify-full` with another CA: refused, as not signed by a CA this machine trusts.
#[test]
fn verify_full_with_a_wrong_ca_is_refused() {
    let other = path(&tls_pg().1.other_ca);
    assert_refused(&url("localhost", &format!("sslmode=verify-full&sslrootcert={other}")), "not signed by a CA", &[]);
}

/// `verify-full` to a host name that the certificate does not name (it names `localhost`).
#[test]
fn verify_full_to_another_host_name_is_refused() {
    let ca = path(&tls_pg().1.ca);
    assert_refused(
        &url("127.0.0.1", &format!("sslmode=verify-full&sslrootcert={ca}")),
        "does not name the host 127.0.0.1",
        &[],
    );
}

/// Without `sslrootcert` the system's roots are used (the ca-certificates bundle, or the file
/// that `SSL_CERT_FILE` names): our private CA is not among them, until SSL_CERT_FILE names it.
#[test]
fn without_sslrootcert_the_system_roots_are_used() {
    let u = url("localhost", "sslmode=verify-full");
    assert_refused(&u, "not signed by a CA", &[]);
    let ca = path(&tls_pg().1.ca);
    let (code, err) = migrate(&u, &[("SSL_CERT_FILE", &ca)]);
    assert_eq!(code, 0, "the system roots now hold the CA: {err}");
    assert_session_encrypted(&u, &[("SSL_CERT_FILE", &ca)]);
}

/// A root certificate file that does not exist is named, as a bad URL.
#[test]
fn a_missing_root_certificate_is_named() {
    let (code, err) = migrate(&url("localhost", "sslmode=verify-full&sslrootcert=/nonexistent/ca.pem"), &[]);
    assert_ne!(code, 0);
    assert!(err.contains("sslrootcert=/nonexistent/ca.pem: no such file"), "{err}");
}

/// `sslmode=require` to a server without TLS says that TLS failed, not that it cannot reach.
#[test]
fn require_against_a_server_without_tls_says_so() {
    let pg = shared_pg();
    let u = format!("{}?sslmode=require", pg.url("postgres"));
    let home = tempfile::tempdir().unwrap();
    let (code, _, err) = run_cli(home.path(), &u, &["migrate"], None);
    assert_ne!(code, 0);
    assert!(err.contains("TLS to the database at 127.0.0.1"), "{err}");
    assert!(!err.contains(&pg.password), "{err}");
}
