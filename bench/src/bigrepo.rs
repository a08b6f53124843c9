//! A repository the size of a mid-sized product, generated once and kept: 20,000 source
//! files (code-like text, compressing about as source code does), 60 large generated files
//! an agent reads whole, and a history of 80 commits that edit a few hundred files each and
//! churn binary assets (random bytes, as images are), so the packed history is over 200 MB.
//!
//! `git fast-import` builds it from one stream; the same seed gives the same repository. It
//! is kept under `~/.cache/devpilot-bench` (or `DEVPILOT_BENCH_CACHE`) with a file of its
//! figures beside it, and made again when that file is missing or from another version.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use serde_json::{json, Value};

use crate::common::log;

/// Bumped when the shape changes: a kept repository of another version is made again.
const VERSION: u32 = 1;
pub const SOURCE_FILES: usize = 20_000;
/// The generated files an agent reads whole (about 60 KB each).
pub const LARGE_FILES: usize = 60;
const COMMITS: usize = 80;
/// Source files each later commit edits.
const EDITS_PER_COMMIT: usize = 250;
/// Bytes of assets each later commit adds (one replaces the oldest kept asset).
const ASSET_BYTES_PER_COMMIT: usize = 2_600_000;
/// Assets in the tree at any moment.
const ASSETS_KEPT: usize = 8;

/// A kept product repository (bare) and what it holds.
pub struct Product {
    pub bare: PathBuf,
    pub figures: Value,
}

/// Where source file `i` lives: 20 areas of 25 modules of 40 files.
pub fn source_path(i: usize) -> String {
    let (area, module, file) = (i / 1000, (i / 40) % 25, i % 40);
    format!("src/area{area:02}/mod{module:02}/file{file:02}.rs")
}

/// Where large file `i` lives.
pub fn large_path(i: usize) -> String {
    format!("generated/schema{i:02}.rs")
}

/// The kept repository, made first if it is not there (a few minutes).
pub fn product() -> Product {
    let root = std::env::var_os("DEVPILOT_BENCH_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/devpilot-bench"));
    let bare = root.join(format!("product-v{VERSION}.git"));
    let stamp = root.join(format!("product-v{VERSION}.json"));
    if let Some(figures) = std::fs::read_to_string(&stamp).ok().and_then(|t| serde_json::from_str(&t).ok()) {
        if bare.join("HEAD").exists() {
            return Product { bare, figures };
        }
    }
    let _ = std::fs::remove_dir_all(&bare);
    std::fs::create_dir_all(&bare).unwrap();
    log(format!("generating the product repository at {} (once)", bare.display()));
    let started = std::time::Instant::now();
    git(&bare, &["init", "--quiet", "--bare", "--initial-branch=main"]);
    let mut child = Command::new("git")
        .args(["fast-import", "--quiet", "--done"])
        .current_dir(&bare)
        .stdin(Stdio::piped())
        .spawn()
        .expect("git fast-import");
    let mut w = std::io::BufWriter::with_capacity(1 << 20, child.stdin.take().unwrap());
    stream(&mut w).expect("writing to git fast-import");
    drop(w);
    assert!(child.wait().unwrap().success(), "git fast-import failed");
    let figures = figures_of(&bare, started.elapsed().as_secs_f64());
    std::fs::write(&stamp, serde_json::to_string_pretty(&figures).unwrap()).unwrap();
    log(format!("the product repository: {figures}"));
    Product { bare, figures }
}

/// The whole history, as fast-import reads it.
fn stream(w: &mut impl Write) -> std::io::Result<()> {
    let mut rng = StdRng::seed_from_u64(43);
    let words = vocabulary(&mut rng);
    let mut time = 1_700_000_000u64;
    commit(w, "Initial import", time)?;
    for i in 0..SOURCE_FILES {
        let lines = rng.random_range(60..200);
        inline(w, &source_path(i), code(&mut rng, &words, lines).as_bytes())?;
    }
    for i in 0..LARGE_FILES {
        inline(w, &large_path(i), code(&mut rng, &words, 1_200).as_bytes())?;
    }
    inline(w, "README.md", b"# product\n\nA mid-sized product, generated for the hand-off benchmark.\n")?;
    let mut assets: std::collections::VecDeque<String> = Default::default();
    for c in 1..COMMITS {
        time += 3_600;
        commit(w, &format!("Change {c}"), time)?;
        for _ in 0..EDITS_PER_COMMIT {
            let i = rng.random_range(0..SOURCE_FILES);
            let lines = rng.random_range(60..200);
            inline(w, &source_path(i), code(&mut rng, &words, lines).as_bytes())?;
        }
        let name = format!("assets/img{c:03}.png");
        let mut bytes = vec![0u8; ASSET_BYTES_PER_COMMIT];
        rng.fill_bytes(&mut bytes);
        inline(w, &name, &bytes)?;
        assets.push_back(name);
        if assets.len() > ASSETS_KEPT {
            writeln!(w, "D {}", assets.pop_front().unwrap())?;
        }
    }
    writeln!(w, "done")
}

/// A commit's header on `main` (a later one's parent is the branch's tip, fast-import's
/// default).
fn commit(w: &mut impl Write, msg: &str, time: u64) -> std::io::Result<()> {
    writeln!(w, "commit refs/heads/main")?;
    writeln!(w, "author Dev <dev@example.com> {time} +0000")?;
    writeln!(w, "committer Dev <dev@example.com> {time} +0000")?;
    writeln!(w, "data {}\n{msg}", msg.len())
}

/// One file, inline in the commit.
fn inline(w: &mut (impl Write + ?Sized), path: &str, bytes: &[u8]) -> std::io::Result<()> {
    writeln!(w, "M 100644 inline {path}\ndata {}", bytes.len())?;
    w.write_all(bytes)?;
    writeln!(w)
}

/// Two thousand made-up identifiers.
fn vocabulary(rng: &mut StdRng) -> Vec<String> {
    const SYL: [&str; 24] = [
        "ka", "lo", "mer", "tin", "sa", "vor", "pel", "dra", "qu", "ix", "no", "ret", "bal", "cor", "fen", "gul",
        "han", "jis", "mok", "nur", "pax", "ros", "tal", "zem",
    ];
    (0..2_000).map(|_| (0..rng.random_range(2..4)).map(|_| SYL[rng.random_range(0..SYL.len())]).collect()).collect()
}

/// `lines` lines of something shaped like Rust.
fn code(rng: &mut StdRng, words: &[String], lines: usize) -> String {
    let mut out = String::with_capacity(lines * 40);
    let mut depth = 0usize;
    for _ in 0..lines {
        let mut w = || words[rng.random_range(0..words.len())].as_str();
        let pad = "    ".repeat(depth);
        let (a, b, c, d, e) = (w(), w(), w(), w(), w());
        let n = rng.random_range(0..1000);
        let line = match (depth, n % 10) {
            (0, _) => {
                depth = 1;
                format!("pub fn {a}_{b}({c}: &{d}) -> Result<{e}, Error> {{")
            }
            (_, 0) => {
                depth -= 1;
                format!("{}}}", "    ".repeat(depth))
            }
            (1..=2, 1) => {
                depth += 1;
                format!("{pad}if {a}.{b}() > {n} {{")
            }
            (_, 2) => format!("{pad}// {a} the {b} before {c} {d}"),
            (_, 3) => format!("{pad}{a}.{b}(&{c}, {})?;", n % 100),
            _ => format!("{pad}let {a}_{b} = {c}::{d}({e}, \"{a}\");"),
        };
        out.push_str(&line);
        out.push('\n');
    }
    out.push_str(&"}\n".repeat(depth));
    out
}

/// The repository's figures: packed size, files, commits, how long it took to make.
fn figures_of(bare: &Path, secs: f64) -> Value {
    let count = git(bare, &["count-objects", "-v"]);
    let kib =
        |k: &str| count.lines().find_map(|l| l.strip_prefix(k)).and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0);
    let files = git(bare, &["ls-tree", "-r", "--name-only", "main"]).lines().count();
    let commits: u64 = git(bare, &["rev-list", "--count", "main"]).trim().parse().unwrap();
    json!({
        "version": VERSION,
        "packed_mb": (kib("size-pack:") + kib("size:")) as f64 / 1024.0,
        "files": files,
        "commits": commits,
        "made_in_s": secs,
    })
}

/// `git ARGS` in `dir`, its output; a failure stops the run.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git").args(args).current_dir(dir).output().expect("git");
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}
