//! What a tracker's issue text becomes in a job, alike for every tracker: the title, the
//! prompt (capped, and saying so), and `requires` from prefixed labels. A stranger's text
//! never fails the job's checks.

/// The longest title a job gets from an issue, in bytes.
const MAX_TITLE: usize = 500;

/// `ENG-7 Fix login` / `#7 Fix login`, with any NUL taken out, at most [`MAX_TITLE`] bytes.
pub fn title_of(identifier: &str, title: &str) -> String {
    let mut t = format!("{identifier} {}", title.replace('\0', ""));
    if t.len() > MAX_TITLE {
        let mut end = MAX_TITLE;
        while !t.is_char_boundary(end) {
            end -= 1;
        }
        t.truncate(end);
    }
    t
}

/// The labels with `prefix`, without it, that are valid label names; sorted, at most the
/// job's number of labels (`needs:gpu` → `gpu`).
pub fn requires_from<'a>(labels: impl Iterator<Item = &'a str>, prefix: &str) -> Vec<String> {
    if prefix.is_empty() {
        return vec![];
    }
    let mut out: Vec<String> = labels
        .filter_map(|l| l.strip_prefix(prefix))
        .map(str::trim)
        .filter(|l| devpilot_store::spec::validate_label(l).is_ok())
        .map(str::to_string)
        .collect();
    out.sort();
    out.dedup();
    out.truncate(devpilot_store::spec::MAX_LABELS);
    out
}

/// The description, at most `cap` bytes (cut at a character boundary, and saying so), with
/// any NUL taken out: a stranger's text never fails the job's checks.
pub fn prompt_of(description: Option<&str>, cap: usize, url: &str) -> String {
    let text = description.unwrap_or("").replace('\0', "");
    if text.len() <= cap {
        return text;
    }
    let note = format!("\n\n[The description is longer than {cap} bytes and was cut here; read it all at {url}]");
    let mut end = cap.saturating_sub(note.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{note}", &text[..end])
}
