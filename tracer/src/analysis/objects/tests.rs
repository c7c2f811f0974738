//! The objects' judgements, on windows and arena series made up for each case.

use super::{KEPT_MIN, undecided_keeper};
use crate::{
    analysis::{Analysis, Verdict},
    ledger::{KeptLine, Ledger},
    model::{GroupKey, Kind, StackId},
};

/// A window of no length before the samples: nothing of them is cut out, and all came
/// after it.
const NO_SPAN: (f64, f64) = (0.0, 0.0);

use crate::analysis::tests::key;

fn line(s: u32, made: u64, kept: u64) -> KeptLine {
    KeptLine {
        stack: Some(StackId::new(s)),
        made,
        kept,
        ..KeptLine::default()
    }
}

/// 20 samples a second apart of two arena stacks (3 and 4) that grow by 1 and 3 MiB a
/// second (`grow`), or hold 4 MiB each.
fn arenas(grow: bool) -> Analysis {
    let mut ledger = Ledger::default();
    ledger.add_root(1, "python3 service.py".into(), Vec::new(), 0);
    let mut a = Analysis::default();
    for i in 0..20u64 {
        let (x, y) = if grow { (i + 1, 3 * (i + 1)) } else { (4, 4) };
        let groups = [(key(3, Kind::Mmap), x << 20), (key(4, Kind::Mmap), y << 20)];
        a.sample(i as f64, &ledger, &groups);
        a.sample_arenas(i as f64, &groups);
    }
    a
}

#[test]
fn a_site_with_half_what_keeping_needs_at_a_keepers_share_is_undecided() {
    let line = |made, kept| {
        (
            KeptLine {
                made,
                kept,
                ..KeptLine::default()
            },
            1,
        )
    };
    // The metrics log at 5 s: 5.3 KiB kept of 9.3 made.
    assert!(undecided_keeper(&[line(9_569, 5_365)]));
    // Enough: it keeps, and it is told.
    assert!(!undecided_keeper(&[line(9_569, KEPT_MIN)]));
    // Two samples: chance, unless they are more than the window's first look saw (a slower
    // run of the same log); three that stopped rising are a line that kept once.
    assert!(!undecided_keeper(&[line(2_080, 2_080)]));
    let (mut rising, mut once) = (line(3_100, 2_080), line(3_100, 3_100));
    rising.0.rising = true;
    assert!(undecided_keeper(&[rising]));
    assert!(!undecided_keeper(&[once]));
    once.0.rising = true;
    once.0.kept = 1_024;
    assert!(!undecided_keeper(&[once]), "one sample: no site yet");
    // A free list's share (a fifth): not a keeper's.
    assert!(!undecided_keeper(&[line(30_000, 6_000)]));
    // Unless what it keeps grew with the window.
    let (mut grows, mut imported) = (line(30_000, 6_000), line(6_000, 6_000));
    grows.0.grows = true;
    assert!(undecided_keeper(&[grows]));
    // What an import kept is its module's state.
    imported.0.imported = true;
    assert!(!undecided_keeper(&[imported]));
}

#[test]
fn the_stacks_that_keep_their_objects_carry_the_arenas_leak_by_share() {
    let mut a = arenas(true);
    let arena = key(3, Kind::Mmap);
    assert_eq!(a.judge(&arena, 0.0).unwrap().verdict, Verdict::Leak);
    let whole = a.judge(&key(4, Kind::Mmap), 0.0).unwrap().slope_bytes_per_s
        + a.judge(&arena, 0.0).unwrap().slope_bytes_per_s;
    assert_eq!(a.growing_arenas(|_| 0.0, 5.0, 2 << 20), vec![1]);
    assert!(
        a.growing_arenas(|_| 0.0, 5.0, 64 << 20).is_empty(),
        "grew 76 MiB in its later half"
    );
    let lines = vec![
        // Kept three quarters, and a quarter (a growing container's arrays made again and
        // again): 3 : 1 of the kept bytes.
        line(1, 4 * KEPT_MIN, 3 * KEPT_MIN),
        line(2, 4 * KEPT_MIN, KEPT_MIN),
        // Temporaries: made the most, kept little.
        line(5, 100 * KEPT_MIN, KEPT_MIN),
        // Kept all it made, but too few samples to tell.
        line(6, KEPT_MIN / 2, KEPT_MIN / 2),
    ];
    let lines = lines
        .into_iter()
        .map(|l| (l, l.stack.unwrap().get()))
        .collect();
    a.objects_sampled(1, NO_SPAN, vec![arena, key(4, Kind::Mmap)], lines);
    let judge = |s| a.judge(&key(s, Kind::Object), 0.0).unwrap();
    let (one, two) = (judge(1), judge(2));
    assert_eq!((one.verdict, two.verdict), (Verdict::Leak, Verdict::Leak));
    assert!(
        (one.slope_bytes_per_s - whole * 0.75).abs() < 1.0,
        "{one:?}"
    );
    assert!(
        (two.slope_bytes_per_s - whole * 0.25).abs() < 1.0,
        "{two:?}"
    );
    assert_eq!(judge(5).verdict, Verdict::Steady);
    assert_eq!(judge(6).verdict, Verdict::Steady);
    assert!(a.judge(&key(9, Kind::Object), 0.0).is_none(), "not sampled");
    assert_eq!(a.judge(&arena, 0.0).unwrap().verdict, Verdict::UnderObjects);
    let order: Vec<u32> = a
        .object_lines(1)
        .unwrap()
        .iter()
        .map(|(l, _)| l.stack.unwrap().get())
        .collect();
    assert_eq!(
        order,
        vec![1, 2, 5, 6],
        "those that keep first, then by bytes made"
    );
}

#[test]
fn a_site_keeping_a_few_percent_keeps_where_what_it_keeps_grows_with_the_window() {
    // A training step's forward: 100 sample intervals of tensor objects made, 3 kept (the
    // loss, with its tensor object); the same kept without growing: temporaries in flight.
    for (grows, verdict) in [(true, Verdict::Leak), (false, Verdict::Steady)] {
        let mut a = arenas(true);
        let forward = KeptLine {
            grows,
            ..line(1, 100 * KEPT_MIN, 3 * KEPT_MIN)
        };
        a.objects_sampled(1, NO_SPAN, vec![key(3, Kind::Mmap)], vec![(forward, 1)]);
        let v = a.judge(&key(1, Kind::Object), 0.0).unwrap().verdict;
        assert_eq!(v, verdict, "grows: {grows}");
    }
}

#[test]
fn what_imports_keep_is_no_keeping_and_arenas_filled_by_imports_alone_are_theirs() {
    let imported = |s, made, kept| KeptLine {
        imported: true,
        ..line(s, made, kept)
    };
    // A line that imports (a loop's first steps) and one that keeps, on one site: only what
    // the second kept counts, a quarter of all made.
    let mut a = arenas(true);
    let (arena, other) = (key(3, Kind::Mmap), key(4, Kind::Mmap));
    let lines = vec![
        (imported(1, 2 * KEPT_MIN, 2 * KEPT_MIN), 7),
        (line(2, 2 * KEPT_MIN, KEPT_MIN), 7),
    ];
    a.objects_sampled(1, NO_SPAN, vec![arena, other], lines);
    let judge = |a: &Analysis, s| a.judge(&key(s, Kind::Object), 0.0).unwrap().verdict;
    assert_eq!(judge(&a, 1), Verdict::Imported);
    assert_eq!(judge(&a, 2), Verdict::Leak);
    assert_eq!(a.judge(&arena, 0.0).unwrap().verdict, Verdict::UnderObjects);
    // Imports alone kept: the arenas grew with the modules.
    let mut b = arenas(true);
    let lines = vec![
        (imported(1, 4 * KEPT_MIN, 2 * KEPT_MIN), 1),
        (line(5, 50 * KEPT_MIN, 0), 5),
    ];
    b.objects_sampled(1, NO_SPAN, vec![arena, other], lines);
    assert_eq!(judge(&b, 1), Verdict::Imported);
    assert_eq!(judge(&b, 5), Verdict::Steady);
    assert_eq!(b.judge(&arena, 0.0).unwrap().verdict, Verdict::Imported);
    // Too few samples of the imports to say: the arenas are judged as pages.
    let mut c = arenas(true);
    let lines = vec![(imported(1, KEPT_MIN, KEPT_MIN / 2), 1)];
    c.objects_sampled(1, NO_SPAN, vec![arena, other], lines);
    assert_eq!(c.judge(&arena, 0.0).unwrap().verdict, Verdict::Leak);
    // A page-level stack the owner found made by an import.
    c.imported(StackId::new(4));
    assert_eq!(c.judge(&other, 0.0).unwrap().verdict, Verdict::Imported);
}

#[test]
fn objects_kept_while_the_arenas_hold_are_no_leak_and_nothing_kept_leaves_the_arenas_leak() {
    let mut flat = arenas(false);
    flat.objects_sampled(
        1,
        NO_SPAN,
        vec![key(3, Kind::Mmap)],
        vec![(line(1, KEPT_MIN, KEPT_MIN), 1)],
    );
    let v = flat.judge(&key(1, Kind::Object), 0.0).unwrap().verdict;
    assert_eq!(v, Verdict::Steady, "a cache filled before the window");
    assert!(flat.growing_arenas(|_| 0.0, 5.0, 1).is_empty());
    let mut none = arenas(true);
    none.objects_sampled(
        1,
        NO_SPAN,
        vec![key(3, Kind::Mmap)],
        vec![(line(5, 9 * KEPT_MIN, 0), 5)],
    );
    let v = none.judge(&key(3, Kind::Mmap), 0.0).unwrap().verdict;
    assert_eq!(
        v,
        Verdict::Leak,
        "no stack kept: the arenas are the leak, at their line"
    );
}

#[test]
fn a_leaking_arena_stack_carries_the_objects_leak_where_all_arenas_together_hold() {
    // Arena stack 3 grows 1 MiB a second while stack 4, the start-up's, gives back as
    // much: the process's arenas hold, the leak's grow.
    let mut ledger = Ledger::default();
    ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
    let mut a = Analysis::default();
    for i in 0..20u64 {
        let (x, y) = (i + 1, 40 - i);
        let groups = [(key(3, Kind::Mmap), x << 20), (key(4, Kind::Mmap), y << 20)];
        a.sample(i as f64, &ledger, &groups);
        a.sample_arenas(i as f64, &groups);
    }
    let arena = key(3, Kind::Mmap);
    let keeps = vec![(line(1, 2 * KEPT_MIN, KEPT_MIN), 1)];
    a.objects_sampled(1, NO_SPAN, vec![arena, key(4, Kind::Mmap)], keeps);
    let leak = a.judge(&key(1, Kind::Object), 0.0).unwrap();
    assert_eq!(leak.verdict, Verdict::Leak);
    let rate = leak.slope_bytes_per_s / (1 << 20) as f64;
    assert!((0.9..1.1).contains(&rate), "1 MiB/s, not {rate}");
    assert_eq!(a.judge(&arena, 0.0).unwrap().verdict, Verdict::UnderObjects);
}

/// A short PyTorch job sampled every quarter of a second until `end_s`: its import maps
/// 105 MiB of arenas evenly over `import` (from, to), which then hold; its window spans
/// `span`, in which a line is found keeping objects (a few KiB its step holds, that grew
/// with the window). The verdict of that line.
fn import_then_window(import: (f64, f64), end_s: f64, span: (f64, f64)) -> Verdict {
    let mut ledger = Ledger::default();
    ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
    let mut a = Analysis::default();
    for i in 0..(end_s * 4.0) as u64 {
        let t = i as f64 / 4.0;
        let done = ((t - import.0) / (import.1 - import.0)).clamp(0.0, 1.0);
        let mib = 3 + (105.0 * done) as u64;
        let groups = [(key(3, Kind::Mmap), mib << 20)];
        a.sample(t, &ledger, &groups);
        a.sample_arenas(t, &groups);
    }
    let keeps = KeptLine {
        grows: true,
        ..line(1, 24 * KEPT_MIN, KEPT_MIN + 1)
    };
    a.objects_sampled(1, span, vec![key(3, Kind::Mmap)], vec![(keeps, 1)]);
    a.judge(&key(1, Kind::Object), 0.0).unwrap().verdict
}

/// Its window opens two seconds into the loop and lasts until it ends: the line is no leak,
/// the arenas grew with the import, not since.
#[test]
fn arenas_an_import_filled_before_a_short_job_are_no_objects_leak() {
    assert_eq!(
        import_then_window((0.0, 4.25), 12.0, (6.25, 12.0)),
        Verdict::Steady
    );
}

/// The same job on a loaded machine, shorter still: its window opens as the import ends
/// (4.25 s) and the job ends 0.75 s after it closes. Without the window's span, its arenas
/// are the import's alone, grown to the end of what is left: no leak of objects, since they
/// held while the window looked and after.
#[test]
fn arenas_an_import_filled_up_to_a_short_jobs_window_are_no_objects_leak() {
    assert_eq!(
        import_then_window((0.0, 4.25), 6.75, (4.25, 5.75)),
        Verdict::Steady
    );
}

/// The same job as the whole suite's check of it saw it on two busy cores: its import,
/// slowed by the tracer, maps arenas from 2.25 to 13.75 s, its window opens in the middle
/// of it (4.2 to 5.7 s, called for by that growth), and its loop runs the last 3.75 s with
/// the arenas held. Held for a quarter of the import's length, not growth: no leak of
/// objects (a series' teardown fall used to begin where it reached its top, which made the
/// whole run the import's rise).
#[test]
fn arenas_an_import_filled_until_a_short_loop_held_them_are_no_objects_leak() {
    assert_eq!(
        import_then_window((2.25, 13.75), 17.5, (4.2, 5.7)),
        Verdict::Steady
    );
}

/// A 25-epoch PyTorch job as it was seen to fail the check on two idle cores, sampled
/// every tenth of a second until `end_s`: its import maps 95 MiB of arenas from 1.1 to
/// 5.25 s at its own lines (stack 2, `imported` where `tell` is), over the 1 MiB of the
/// interpreter's start (stack 3), and they hold; its exit, at 9.7 s, maps an arena of each.
fn torch_import(tell: bool, end_s: f64) -> Analysis {
    let mut ledger = Ledger::default();
    ledger.add_root(1, "python3 torch_train.py 25 fixed".into(), Vec::new(), 0);
    let mut a = Analysis::default();
    if tell {
        a.imported(StackId::new(2));
    }
    for i in 0..(end_s * 10.0) as u64 {
        let t = i as f64 / 10.0;
        let exit = u64::from(t >= 9.7);
        let import = 6 + (95.0 * ((t - 1.1) / 4.15).clamp(0.0, 1.0)) as u64 + exit;
        let groups = [
            (key(2, Kind::Mmap), import << 20),
            (key(3, Kind::Mmap), (1 + exit) << 20),
        ];
        a.sample(t, &ledger, &groups);
        a.sample_arenas(t, &groups);
    }
    a
}

/// That job to its end at 10.4 s, its window open as the import ended (5.25 to 7.87 s),
/// finding the loop's first `loss.backward()` keeping a few KiB, that grew with the window.
/// The verdict of that line.
fn import_then_loop(tell: bool) -> Verdict {
    let mut a = torch_import(tell, 10.4);
    let keeps = KeptLine {
        grows: true,
        ..line(1, 64 * KEPT_MIN, KEPT_MIN + 1)
    };
    let arenas = vec![key(2, Kind::Mmap), key(3, Kind::Mmap)];
    a.objects_sampled(1, (5.25, 7.87), arenas, vec![(keeps, 1)]);
    a.judge(&key(1, Kind::Object), 0.0).unwrap().verdict
}

/// Judged with the import's arenas, the whole run reads as a leak of 20 MiB/s at that line;
/// judged on the program's, it held.
#[test]
fn arenas_an_import_mapped_are_not_a_short_loops_objects_leak() {
    assert_eq!(import_then_loop(false), Verdict::Leak);
    assert_eq!(import_then_loop(true), Verdict::Steady);
}

/// The arenas of that import, at its end, call for the window where the program's lines
/// mapped them, and not where the import's did.
#[test]
fn an_imports_own_arenas_call_for_no_window() {
    let grown = |tell| torch_import(tell, 5.3).growing_arenas(|_| 0.0, 2.0, 2 << 20);
    assert_eq!(grown(false), vec![1]);
    assert!(grown(true).is_empty());
}

/// An interpreter that imported torch (100 MiB of arenas in 4 s), then leaks objects slowly:
/// one 1 MiB arena every 3 s, a second a sample; its window, from 24 to 30 s, stalls it.
fn slow_leak(a: &mut Analysis, ledger: &Ledger, seconds: std::ops::Range<u64>) {
    for t in seconds {
        let program_s = if t < 24 {
            t
        } else {
            t.saturating_sub(6).max(24)
        };
        let mib = if t < 4 {
            25 * (t + 1)
        } else {
            100 + (program_s - 4) / 3
        };
        let groups = [(key(3, Kind::Mmap), mib << 20)];
        a.sample(t as f64, ledger, &groups);
        a.sample_arenas(t as f64, &groups);
    }
}

#[test]
fn a_slow_leak_over_an_interpreters_arenas_is_found_at_the_programs_rate() {
    let mut ledger = Ledger::default();
    ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
    let mut a = Analysis::default();
    slow_leak(&mut a, &ledger, 0..20);
    assert_eq!(
        a.growing_arenas(|_| 0.0, 2.0, 2 << 20),
        vec![1],
        "3 MiB over the later half's 10 s, on 100 MiB"
    );
    slow_leak(&mut a, &ledger, 20..48);
    let keeps = vec![(line(1, 2 * KEPT_MIN, KEPT_MIN), 1)];
    let mut cut = Analysis::default();
    slow_leak(&mut cut, &ledger, 0..48);
    cut.objects_sampled(1, (24.0, 30.0), vec![key(3, Kind::Mmap)], keeps.clone());
    let leak = cut.judge(&key(1, Kind::Object), 0.0).unwrap();
    assert_eq!(leak.verdict, Verdict::Leak);
    let rate = leak.slope_bytes_per_s / (1 << 20) as f64;
    assert!((0.28..0.39).contains(&rate), "1/3 MiB/s, not {rate}");
    a.objects_sampled(1, NO_SPAN, vec![key(3, Kind::Mmap)], keeps);
    let stalled = a.judge(&key(1, Kind::Object), 0.0).unwrap();
    let rate = stalled.slope_bytes_per_s / (1 << 20) as f64;
    let cut = leak.slope_bytes_per_s / (1 << 20) as f64;
    assert!(
        rate < 0.9 * cut,
        "the window's stall in it: {rate}, not {cut}"
    );
}

/// 20 samples a second apart of a worker whose malloc family is seen and whose objects were
/// never sampled: an arena stack (3) grows by an arena every `every` samples, a heap stack (5)
/// by `heap` MiB a sample.
fn arenas_beside_heap(every: u64, heap: u64) -> (Analysis, GroupKey) {
    let ledger = crate::analysis::tests::worker_with_malloc_seen();
    let mut a = Analysis::default();
    let arena = key(3, Kind::Mmap);
    for i in 0..20u64 {
        let groups = [
            (arena, (1 + i / every) << 20),
            (key(5, Kind::Heap), (1 + i * heap) << 20),
        ];
        a.sample(i as f64, &ledger, &groups);
        a.sample_arenas(i as f64, &groups[..1]);
    }
    (a, arena)
}

#[test]
fn arenas_never_sampled_beside_a_far_larger_heap_leak_are_under_the_heap() {
    let verdict = |every, heap| {
        let (a, arena) = arenas_beside_heap(every, heap);
        a.judge(&arena, 0.0).unwrap().verdict
    };
    // An arena every 4 s beside a heap leak of 2 MiB/s: the objects that own its blocks.
    assert_eq!(verdict(4, 2), Verdict::UnderHeap);
    // No heap leak: the arenas' own.
    assert_eq!(verdict(4, 0), Verdict::Leak);
    // Arenas growing as fast as the heap: a leak of objects of their own beside it.
    assert_eq!(verdict(1, 1), Verdict::Leak);
}
