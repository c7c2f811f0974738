//! Failures on purpose, for the tests of what leaktracer does when something fails (its panic
//! hook's message and exit status, a job it held going on, a library it could not probe): in a
//! debug build, `LEAKTRACER_FAULT=SITE` makes the code at that site fail. A release build reads
//! nothing.

/// The site `LEAKTRACER_FAULT` names (debug builds only).
#[cfg(debug_assertions)]
fn chosen() -> Option<&'static str> {
    static SITE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    SITE.get_or_init(|| std::env::var("LEAKTRACER_FAULT").ok())
        .as_deref()
}

/// Panics when `LEAKTRACER_FAULT` names `site` (debug builds only).
#[cfg(debug_assertions)]
pub fn at(site: &str) {
    if chosen() == Some(site) {
        panic!("a failure on purpose at {site} (LEAKTRACER_FAULT)");
    }
}

/// Whether `LEAKTRACER_FAULT` names `site:what` (debug builds only): the caller then fails as
/// it would for a real error.
#[cfg(debug_assertions)]
pub fn fails(site: &str, what: &str) -> bool {
    chosen().is_some_and(|c| c.strip_prefix(site).and_then(|c| c.strip_prefix(':')) == Some(what))
}

/// Nothing, in a release build.
#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn at(_site: &str) {}

/// Never, in a release build.
#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn fails(_site: &str, _what: &str) -> bool {
    false
}
