//! `--tensors auto`: what a process whose tensors went in late is judged on, and a short job's
//! pages judged on what they did before them.

use super::tests::{K, key};
use super::*;

/// `--tensors auto`: the pages of a process whose tensors went in late are judged from then
/// on, and not on a tail too short to tell; its tensors in the span they are traced in, never
/// while taken out.
#[test]
fn late_tensors_cut_what_their_process_is_judged_on() {
    let (mut a, pages, tensors) = late_tensors(0);
    let whole = classify(&a.groups[&pages].series, 0.0).unwrap();
    assert_eq!(
        whole.verdict,
        Verdict::Leak,
        "the whole run reads as a leak"
    );
    assert!(
        a.judge(&pages, 0.0).is_none(),
        "2.5 s since the tensors: too short"
    );
    assert!(a.judge_final(&pages, 0.0).is_none());
    let t = a.judge(&tensors, 0.0).unwrap();
    assert_ne!(
        t.verdict,
        Verdict::Leak,
        "the rise as they went in is left out"
    );
    a.tensors_taken_out(1, 14.0, TakenOut::Forgotten);
    assert!(
        a.judge(&tensors, 0.0).is_none(),
        "not judged while taken out"
    );
    assert!(a.released_leaks(&Default::default(), 0.0).is_empty());
}

/// Samples every half second of a process whose pages grow until its tensors go in at sample
/// `at` (what called for them), then hold; one block more at 12 s. Its tensors rise to 8 MiB,
/// then by `step(n)` at the n-th sample since; the run ends at 12.5 s. The pages' stack and the
/// tensors'.
fn late_tensors_at(at: u64, step: impl Fn(u64) -> u64) -> (Analysis, GroupKey, GroupKey) {
    let mut ledger = Ledger::default();
    ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
    let (pages, tensors) = (key(1, Kind::Brk), key(2, Kind::Tensor));
    let mut a = Analysis::default();
    for i in 0..26u64 {
        let brk = i.min(at) * 8 * K + if i >= 24 { 8 * K } else { 0 };
        let held = if i >= at { (8 << 20) + step(i - at) } else { 0 };
        if i == at {
            a.tensors_traced_from(1, at as f64 / 2.0);
        }
        a.sample(i as f64 / 2.0, &ledger, &[(pages, brk), (tensors, held)]);
    }
    (a, pages, tensors)
}

/// As [`late_tensors_at`], the tensors going in at 10 s.
fn late_tensors(step: u64) -> (Analysis, GroupKey, GroupKey) {
    late_tensors_at(20, |n| n * step)
}

/// A short job's tensors went in 2.5 s before its end, too late to show a leak, and grew in
/// every window since: its pages are judged at the end on what they did before (a leak at
/// their line), not left without a verdict. Where they held instead (the run above), none;
/// where too little came after to tell, on what had them traced.
#[test]
fn a_short_jobs_pages_are_judged_before_its_late_tensors_where_they_grew_since() {
    let (a, pages, _) = late_tensors(1 << 20);
    assert!(a.judge(&pages, 0.0).is_none(), "while it runs: cut");
    let e = a.judge_final(&pages, 0.0).unwrap();
    assert_eq!(e.verdict, Verdict::Leak, "{e:?}");
    assert!(e.windows.last().unwrap().t1_s <= 10.0, "{e:?}");
    assert_eq!(e.growth_bytes, 120 * K as i64, "{e:?}");
    assert!(
        a.grew_on_after_late_tensors(&pages, 0.0),
        "a rise small beside a large heap's is still the leak's start"
    );
    // Grown by one tensor once, then flat: no leak went on.
    let (a, pages, tensors) = late_tensors(0);
    assert!(a.judge_final(&pages, 0.0).is_none());
    assert!(!a.grew_on_after_late_tensors(&pages, 0.0));
    assert!(
        a.judge_final(&tensors, 0.0)
            .is_none_or(|t| t.verdict != Verdict::Leak)
    );
    // Grown in all windows since but one (a busy machine's samples spaced unevenly; floors of
    // 0, 2, 2 and 3 MiB over the ramp): went on.
    let (a, pages, _) = late_tensors_at(20, |n| (n - u64::from(n >= 3)) << 20);
    assert_eq!(a.judge_final(&pages, 0.0).unwrap().verdict, Verdict::Leak);
    // Gone in at 12 s, half a second before the end: too little since to tell whether the
    // memory held; judged on what had the tensors traced.
    let (a, pages, _) = late_tensors_at(24, |_| 0);
    let e = a.judge_final(&pages, 0.0).unwrap();
    assert_eq!(e.verdict, Verdict::Leak, "{e:?}");
    assert!(e.windows.last().unwrap().t1_s <= 12.0, "{e:?}");
    assert!(!a.grew_on_after_late_tensors(&pages, 0.0));
}

/// `--tensors auto`: a tensor stack judged on its chain is moved only where the process's
/// tensors held while it grew (another tensor stack gave back what it gained), not where its
/// heap held: heap blocks freed meanwhile (a data cache let go) do not explain a leak of tensors.
#[test]
fn tensors_on_their_chain_are_moved_only_where_the_tensors_held() {
    let run = |falls: Kind| {
        let mut ledger = Ledger::default();
        ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
        let (rising, other) = (key(1, Kind::Tensor), key(2, falls));
        let mut a = Analysis::default();
        // Samples every half second, the tensors traced from 2 s: one stack gains 64 KiB a
        // sample as the other gives as much back.
        a.tensors_traced_from(1, 2.0);
        for i in 4..30u64 {
            let gained = (i - 4) * 64 * K;
            let groups = [(rising, gained), (other, 2048 * K - gained)];
            a.sample(i as f64 / 2.0, &ledger, &groups);
        }
        a.judge(&rising, 0.0).unwrap().verdict
    };
    assert_eq!(run(Kind::Tensor), Verdict::Moved);
    assert_eq!(run(Kind::Heap), Verdict::Leak);
}
