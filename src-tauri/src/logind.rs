//! The part of systemd-logind's Manager (org.freedesktop.login1, on the system bus) that the
//! sleep hook ([`crate::sleep`]) and keep-awake ([`crate::awake`]) use. An inhibitor is held
//! for as long as the file descriptor `Inhibit` returns is open: dropping it releases it.

#[zbus::proxy(
    interface = "org.freedesktop.login1.Manager",
    default_service = "org.freedesktop.login1",
    default_path = "/org/freedesktop/login1"
)]
pub trait Login1Manager {
    fn inhibit(&self, what: &str, who: &str, why: &str, mode: &str) -> zbus::Result<zbus::zvariant::OwnedFd>;

    #[zbus(signal)]
    fn prepare_for_sleep(&self, start: bool) -> zbus::Result<()>;
}
