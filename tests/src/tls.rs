//! TLS to PostgreSQL: a private CA and a server certificate made with openssl, and a
//! throwaway cluster with `ssl=on` that presents it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::pg::{is_root, PgCluster, TEST_SETTINGS};
use crate::watchdog::remove_when_gone;

/// The files of a test PKI: `ca` signed the server's certificate, which names only
/// `localhost`; `other_ca` signed nothing the server has.
pub struct Certs {
    pub dir: PathBuf,
    pub ca: PathBuf,
    pub other_ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
}

/// Runs openssl in `dir` with `args` (split on whitespace: no argument here has a space).
fn openssl(dir: &Path, args: &str) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args.split_whitespace())
        .output()
        .expect("run openssl (package openssl)");
    assert!(out.status.success(), "openssl {args} failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// An EC P-256 key: fast to make, and rustls takes it.
const EC_KEY: &str = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";

fn make_ca(dir: &Path, name: &str) {
    openssl(
        dir,
        &format!(
            "req -x509 {EC_KEY} -keyout {name}.key -out {name}.pem -days 3 -subj /CN=devpilot-test-{name} \
             -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign"
        ),
    );
}

impl Certs {
    /// Makes a CA, a second CA, and a server certificate for `localhost` signed by the first.
    pub fn make() -> Certs {
        let dir = tempfile::Builder::new().prefix("devpilot-pki-").tempdir().expect("tempdir").keep();
        remove_when_gone(&dir);
        make_ca(&dir, "ca");
        make_ca(&dir, "other-ca");
        openssl(&dir, &format!("req {EC_KEY} -keyout server.key -out server.csr -subj /CN=localhost"));
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\n\
             keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
        )
        .expect("server.ext");
        openssl(
            &dir,
            "x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 3 \
             -extfile server.ext",
        );
        // PostgreSQL refuses a key that others can read, and reads it as its own user.
        if is_root() {
            let st = Command::new("chown").args(["-R", "postgres:postgres"]).arg(&dir).status().expect("chown");
            assert!(st.success());
        }
        let key = dir.join("server.key");
        std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod key");
        Certs {
            ca: dir.join("ca.pem"),
            other_ca: dir.join("other-ca.pem"),
            server_cert: dir.join("server.pem"),
            server_key: key,
            dir,
        }
    }
}

static TLS_PG: OnceLock<(PgCluster, Certs)> = OnceLock::new();

/// The test binary's cluster with `ssl=on`, presenting a certificate for `localhost` from
/// [`Certs::ca`]. Plain connections are still accepted (`sslmode=disable` works).
pub fn tls_pg() -> &'static (PgCluster, Certs) {
    TLS_PG.get_or_init(|| {
        let certs = Certs::make();
        let cert = certs.server_cert.display().to_string();
        let key = certs.server_key.display().to_string();
        let mut settings: Vec<(&str, &str)> = TEST_SETTINGS.to_vec();
        settings.extend([("ssl", "on"), ("ssl_cert_file", cert.as_str()), ("ssl_key_file", key.as_str())]);
        let pg = PgCluster::start_with("devpilot-pg-tls-", &settings);
        (pg, certs)
    })
}
