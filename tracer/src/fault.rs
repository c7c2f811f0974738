//! Failures on purpose, for the tests of what leaktracer leaves behind when it fails (its panic
//! hook's message and exit status, a job it held going on): in a debug build,
//! `LEAKTRACER_FAULT=SITE` makes the code at that site panic. A release build reads nothing.

/// Panics when `LEAKTRACER_FAULT` names `site` (debug builds only).
#[cfg(debug_assertions)]
pub fn at(site: &str) {
    static SITE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let chosen = SITE.get_or_init(|| std::env::var("LEAKTRACER_FAULT").ok());
    if chosen.as_deref() == Some(site) {
        panic!("a failure on purpose at {site} (LEAKTRACER_FAULT)");
    }
}

/// Nothing, in a release build.
#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn at(_site: &str) {}
