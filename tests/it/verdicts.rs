//! Verdicts on a real process: one call site that leaks slowly under large spikes, one that only
//! spikes, and a cache that plateaus, told apart from the sampled series of each stack.

use tests::{fixture, report::frame_fn};

#[test]
fn a_slow_leak_under_spikes_is_flagged_and_spikes_and_caches_are_not() {
    let Some(t) = fixture::trace_fixture("patterns", &["--sample", "0.1"], &["40"]) else {
        return;
    };
    assert_eq!(t.output.status.code(), Some(0));
    let r = t.last();
    let verdict = |function: &str| {
        let s = r
            .stacks()
            .iter()
            .find(|s| s["kind"] == "heap" && frame_fn(s, 0) == Some(function))
            .unwrap_or_else(|| panic!("no heap stack for {function}"));
        s["verdict"].clone()
    };
    let leak = verdict("activations");
    assert_eq!(leak["verdict"], "leak", "{leak}");
    assert_eq!(leak["windows"].as_array().unwrap().len(), 4);
    assert!(leak["slope_bytes_per_s"].as_f64().unwrap() > 0.0, "{leak}");
    assert!(leak["growth_bytes"].as_i64().unwrap() > 0, "{leak}");
    let spike = verdict("validation");
    assert_eq!(spike["verdict"], "spike", "{spike}");
    let cache = verdict("lru_put");
    assert_eq!(cache["verdict"], "bounded_cache", "{cache}");
}
