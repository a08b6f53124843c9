//! Unit tests of the parts with no I/O: an issue as a job, the filter of a turn, what each
//! event says, and the settings' checks.

use serde_json::json;

use super::linear::{self, Issue};
use super::settings::SourceSettings;

fn issue(labels: &[&str]) -> Issue {
    serde_json::from_value(json!({
        "id": "0b5f1c9e-1111-4222-8333-444455556666", "identifier": "ENG-7", "title": "Fix login redirect",
        "description": "It loops.", "url": "https://linear.app/acme/issue/ENG-7/fix-login-redirect",
        "branchName": "ada/eng-7-fix-login-redirect", "priority": 1.0, "updatedAt": "2026-12-02T10:00:00.000Z",
        "team": {"id": "t-1", "key": "ENG"}, "project": {"name": "Mobile"}, "state": {"type": "unstarted"},
        "assignee": null, "labels": {"nodes": labels.iter().map(|l| json!({"name": l})).collect::<Vec<_>>()},
    }))
    .unwrap()
}

fn source() -> SourceSettings {
    SourceSettings { teams: vec!["ENG".into()], ..SourceSettings::default() }
}

/// The payload carries the identifier and title, the URL, Linear's branch name, the repo by
/// label before project before team, the prefixed labels as `requires`, and where it came
/// from; priority 1 (urgent) is the highest job priority and 0 (none) the lowest.
#[test]
fn an_issue_becomes_a_payload() {
    let mut s = source();
    s.repo_by_team.insert("ENG".into(), "api".into());
    s.repo_by_project.insert("Mobile".into(), "ios".into());
    let i = issue(&["agent", "needs:gpu", "needs:bad label"]);
    let p = linear::payload_of(&i, "eng", &s);
    assert_eq!(p["title"], json!("ENG-7 Fix login redirect"));
    assert_eq!(p["branch"], json!("eng-7-fix-login-redirect"), "the last part of Linear's branch name");
    assert_eq!(p["repo"], json!("ios"), "the project's mapping beats the team's");
    assert_eq!(p["requires"], json!(["gpu"]), "a label that is no valid name is dropped");
    assert_eq!(p["source"]["identifier"], json!("ENG-7"));
    s.repo_by_label.insert("needs:gpu".into(), "ml".into());
    assert_eq!(linear::payload_of(&i, "eng", &s)["repo"], json!("ml"), "a label's mapping beats both");
    assert!(devpilot_store::spec::check_payload(&p).is_ok());
    assert_eq!(linear::key_of("ENG-7"), "linear:ENG-7");
    let order: Vec<i32> = [1.0, 2.0, 3.0, 4.0, 0.0].iter().map(|p| linear::priority_of(*p)).collect();
    assert_eq!(order, [4, 3, 2, 1, 0]);
}

/// A 1 MB description becomes a prompt within the cap that says where the rest is; an
/// empty one an empty prompt; a NUL never reaches the job.
#[test]
fn a_long_description_is_capped() {
    let big = "é".repeat(512 * 1024);
    let p = linear::prompt_of(Some(&big), 32 * 1024, "https://linear.app/x");
    assert!(p.len() <= 32 * 1024, "{}", p.len());
    assert!(p.ends_with("read it all at https://linear.app/x]"));
    assert_eq!(linear::prompt_of(None, 1024, "u"), "");
    assert_eq!(linear::prompt_of(Some("a\0b"), 1024, "u"), "ab");
}

/// The first turn asks for the issues the source takes; later turns ask for every change
/// of its teams since the cursor, so an issue that left the filter is seen too. Matching
/// is by team, label (any case), state type and, if asked, assignee.
#[test]
fn the_filter_of_a_turn() {
    let s = source();
    let first = linear::filter(&s, None);
    assert_eq!(first["and"][1]["labels"]["some"]["name"]["eqIgnoreCase"], json!("agent"));
    assert_eq!(first["and"][2]["state"]["type"]["in"], json!(["unstarted", "started"]));
    let later = linear::filter(&s, Some("2026-12-02T10:00:00.000Z"));
    assert_eq!(later["and"][1]["updatedAt"]["gte"], json!("2026-12-02T09:59:50.000Z"), "10 s of overlap");
    assert!(issue(&["Agent"]).matches(&s));
    assert!(!issue(&["other"]).matches(&s));
    let mine = SourceSettings { assigned_to_me: true, ..source() };
    assert!(!issue(&["agent"]).matches(&mine), "unassigned");
}

/// Each bad setting names what is wrong.
#[test]
fn bad_sources_are_refused_with_their_reason() {
    let err = |s: SourceSettings| s.validate("eng").unwrap_err().to_string();
    assert!(err(SourceSettings::default()).contains("at least one team"));
    assert!(err(SourceSettings { states: vec!["doing".into()], ..source() }).contains("'doing' is not a state type"));
    let fast = SourceSettings { interval: crate::span::Span::parse("5s").unwrap(), ..source() };
    assert!(err(fast).contains("minimum of 15s"));
    let plain = SourceSettings { api_url: Some("http://example.com/graphql".into()), ..source() };
    assert!(err(plain).contains("must be https"));
    let local = SourceSettings { api_url: Some("http://127.0.0.1:9/graphql".into()), ..source() };
    assert!(local.validate("eng").is_ok());
    assert!(source().validate("bad name").is_err());
}

/// A Linear source whose jobs would name no repo waits (its work would be thrown away), unless
/// it names one or says `no_repo = true`; a GitHub source names its repository.
#[test]
fn a_linear_source_with_no_repo_waits() {
    let why = source().names_no_repo().expect("it waits");
    assert!(why.contains("takes no issue until it names one") && why.contains("no_repo = true"), "{why}");
    let mapped = SourceSettings { maps_to: "webapp".into(), ..source() };
    assert_eq!(mapped.names_no_repo(), None);
    let by_team = SourceSettings { repo_by_team: [("ENG".into(), "webapp".into())].into(), ..source() };
    assert_eq!(by_team.names_no_repo(), None);
    assert_eq!(SourceSettings { no_repo: true, ..source() }.names_no_repo(), None, "asked for");
    let github =
        SourceSettings { kind: super::SourceKind::Github, repo: "acme/webapp".into(), ..SourceSettings::default() };
    assert_eq!(github.names_no_repo(), None);
}
