//! The tray menu's Limits part: what the fleet's governor says (each account held or near its
//! cap, the day's spend against its cap) and the fleet's switch, as text, and whether there
//! is anything to say at all. Pure functions of the engine's [`LimitsView`], tested without a
//! display; and the one OS call that shows or hides the part.
//!
//! The part is three fixed items of the menu (the lines, the switch, a separator), hidden
//! while there is nothing to say: a new user's menu is what it was. They are hidden, not
//! removed: inserting and removing items in a live appindicator menu left it unable to open
//! on xfce4-panel (see tray.rs).

use devpilot_app::limits::{AccountState, LimitsView};

/// How many accounts the part lists by name; the rest are counted.
const ACCOUNTS_MAX: usize = 4;

/// The switch's text: checked while jobs parked on a usage limit resume by themselves.
pub const RESUME_TEXT: &str = "Resume jobs after usage limits";

/// Whether the part shows: an account is held, near or past its cap; something was spent
/// today; a cap is set; or jobs parked on a limit wait for a person (the switch is off). A
/// new user (no cap, nothing spent, every account ok) sees nothing.
pub fn worth_showing(v: &LimitsView) -> bool {
    v.accounts.iter().any(|a| a.state != AccountState::Ok || a.cap_usd.is_some())
        || v.day.spent_usd > 0.0
        || v.day.cap_usd.is_some()
        || v.job_cap_usd.is_some()
        || v.limits_paused
}

/// The part's lines: a title, one line per account ("claude · work: limited until 14:05",
/// "claude · key 3f9a1c…: ok", "codex · home: 80 % of today's cap"), this machine's first,
/// then the day ("today: $3.20 of $20.00 (16 %)") when something was spent or it has a cap,
/// and the job cap ("each job: up to $2.00") when one is set.
pub fn lines(v: &LimitsView) -> Vec<String> {
    let mut out = vec!["Limits".to_string()];
    out.extend(v.accounts.iter().take(ACCOUNTS_MAX).map(|a| format!("{}: {}", a.label, a.line)));
    match v.accounts.len().saturating_sub(ACCOUNTS_MAX) {
        0 => {}
        1 => out.push("… and 1 more account".to_string()),
        n => out.push(format!("… and {n} more accounts")),
    }
    if v.day.spent_usd > 0.0 || v.day.cap_usd.is_some() {
        out.push(v.day.line.clone());
    }
    if let Some(cap) = v.job_cap_usd {
        out.push(format!("each job: up to ${cap:.2}"));
    }
    out
}

/// The part's text, as the one menu item shows it (a line each).
pub fn text(v: &LimitsView) -> String {
    lines(v).join("\n")
}

/// Shows or hides the top-level menu items at `at` (of `len` items in all), as the tray host
/// reads them (GTK's visibility, which the indicator's dbusmenu says as `visible`). A failure
/// is logged, never fatal: the items then stay as they were.
#[cfg(target_os = "linux")]
pub fn set_visible<R: tauri::Runtime>(
    tray: &tauri::tray::TrayIcon<R>,
    at: std::ops::Range<usize>,
    len: usize,
    visible: bool,
) {
    use std::ffi::c_void;

    use gtk::glib::translate::from_glib_none;
    use gtk::prelude::{ContainerExt, WidgetExt};

    let done = tray.with_inner_tray_icon(move |inner| {
        // SAFETY: as in tray.rs (sni_title): the wrapper tray-icon hands out is alive while
        // `inner` is, and its one field is the indicator's GObject pointer.
        let wrapper: *const libappindicator::AppIndicator = unsafe { inner.app_indicator() };
        let raw =
            if wrapper.is_null() { std::ptr::null_mut() } else { unsafe { wrapper.cast::<*mut c_void>().read() } };
        if raw.is_null() {
            return Err("the tray indicator is gone".to_string());
        }
        // SAFETY: `raw` is the live indicator; the menu it answers is owned by it (not
        // transferred), so it is taken with a new reference (`from_glib_none`).
        let menu = std::panic::catch_unwind(|| unsafe { libappindicator::app_indicator_get_menu(raw.cast()) })
            .map_err(|_| "this appindicator library has no app_indicator_get_menu".to_string())?;
        if menu.is_null() {
            return Err("the tray indicator has no menu".to_string());
        }
        let menu: gtk::Menu = unsafe { from_glib_none(menu.cast::<gtk::ffi::GtkMenu>()) };
        let items = menu.children();
        if items.len() != len {
            return Err(format!("the tray menu has {} items where {len} were built", items.len()));
        }
        for item in items.get(at).unwrap_or_default() {
            item.set_visible(visible);
        }
        Ok(())
    });
    let err = match done {
        Ok(Ok(())) => return,
        Ok(Err(e)) => e,
        Err(e) => e.to_string(),
    };
    tracing::warn!(error = %err, visible, "cannot show or hide the tray menu's Limits part");
}

/// Elsewhere the part always shows (no hiding there yet).
#[cfg(not(target_os = "linux"))]
pub fn set_visible<R: tauri::Runtime>(
    _tray: &tauri::tray::TrayIcon<R>,
    _at: std::ops::Range<usize>,
    _len: usize,
    _visible: bool,
) {
}

#[cfg(test)]
mod tests {
    use super::*;
    use devpilot_app::limits::{AccountView, DayView};

    fn account(name: &str, state: AccountState, line: &str) -> AccountView {
        AccountView {
            account: name.into(),
            label: name.replace(':', " · "),
            state,
            held_until: None,
            spent_today_usd: 0.0,
            cap_usd: None,
            line: line.into(),
        }
    }

    fn view(accounts: Vec<AccountView>, spent: f64, cap: Option<f64>) -> LimitsView {
        let line = match cap {
            Some(c) => format!("today: ${spent:.2} of ${c:.2} ({:.0} %)", (spent / c * 100.0).floor()),
            None => format!("today: ${spent:.2}"),
        };
        LimitsView {
            this_account: accounts.first().map(|a| a.account.clone()),
            accounts,
            day: DayView {
                start_ms: 0,
                time_zone: "UTC".into(),
                spent_usd: spent,
                cap_usd: cap,
                share: cap.map(|c| spent / c),
                line,
            },
            job_cap_usd: None,
            limits_paused: false,
        }
    }

    /// A new user's tray (an account that is ok, nothing spent, no cap) says nothing; the
    /// first spend, a cap, a held account or the switch turned off each bring the part.
    #[test]
    fn nothing_to_say_shows_nothing() {
        let ok = || vec![account("claude:work", AccountState::Ok, "ok")];
        assert!(!worth_showing(&view(ok(), 0.0, None)));
        assert!(!worth_showing(&view(vec![], 0.0, None)));
        assert!(worth_showing(&view(ok(), 0.42, None)));
        assert!(worth_showing(&view(ok(), 0.0, Some(20.0))));
        assert!(worth_showing(&view(
            vec![account("claude:work", AccountState::Limited, "limited until 14:05")],
            0.0,
            None
        )));
        assert!(worth_showing(&LimitsView { limits_paused: true, ..view(ok(), 0.0, None) }));
        assert!(worth_showing(&LimitsView { job_cap_usd: Some(2.0), ..view(vec![], 0.0, None) }));
    }

    /// The lines: each account as the engine says it, the day when there is spend or a cap,
    /// the job cap; past four accounts the rest are counted.
    #[test]
    fn lines_say_each_account_and_the_day() {
        let v = view(
            vec![
                account("claude:work", AccountState::Limited, "limited until 14:05"),
                account("codex:home", AccountState::NearCap, "80 % of today's cap"),
            ],
            3.2,
            Some(20.0),
        );
        assert_eq!(
            text(&v),
            "Limits\nclaude · work: limited until 14:05\ncodex · home: 80 % of today's cap\ntoday: $3.20 of $20.00 (16 %)"
        );
        let many = (0..6).map(|i| account(&format!("claude:a{i}"), AccountState::Ok, "ok")).collect();
        let v = LimitsView { job_cap_usd: Some(2.0), ..view(many, 0.0, None) };
        let l = lines(&v);
        assert_eq!(&l[l.len() - 2..], ["… and 2 more accounts", "each job: up to $2.00"]);
        assert!(!l.iter().any(|x| x.starts_with("today")), "nothing spent, no cap: no day line: {l:?}");
    }
}
