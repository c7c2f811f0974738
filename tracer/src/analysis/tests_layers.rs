//! Which page-level stacks call for a process's next layer under `--heap auto`: its tensors,
//! its malloc family.

use super::tests::{kept_then_traced_again, kept_then_traced_again_by, key};
use super::*;

/// The analysis after 20 samples a second apart of a training job's process whose `stacks`
/// each hold, in each quarter of them, the KiB its floors say.
fn by_floors(stacks: &[(GroupKey, [u64; 4])]) -> Analysis {
    let windows: Vec<(GroupKey, [(u64, u64); 4])> = stacks
        .iter()
        .map(|(k, floors)| (*k, floors.map(|f| (f, f))))
        .collect();
    by_windows(&windows)
}

/// As [`by_floors`], each quarter's samples at its floor but its third, at its peak (KiB).
fn by_windows(stacks: &[(GroupKey, [(u64, u64); 4])]) -> Analysis {
    let mut ledger = Ledger::default();
    ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
    let mut analysis = Analysis::default();
    for i in 0..20u64 {
        let groups: Vec<(GroupKey, u64)> = stacks
            .iter()
            .map(|(k, w)| {
                let (floor, peak) = w[(i / 5) as usize];
                (*k, if i % 5 == 2 { peak } else { floor } << 10)
            })
            .collect();
        analysis.sample(i as f64, &ledger, &groups);
    }
    analysis
}

/// No layer is called for by pages that rose in their last window only: a heap's top placed
/// higher once (a DataLoader job's main process, 25 MiB higher for a collated batch), or a
/// mapping made once. Rising in the last two windows, they do (a leak that began).
#[test]
fn pages_that_rose_in_their_last_window_only_call_for_no_layer() {
    let (top, mapped, began) = (key(1, Kind::Brk), key(2, Kind::Mmap), key(3, Kind::Brk));
    let analysis = by_floors(&[
        (top, [6144, 6144, 6144, 30720]),
        (mapped, [392, 392, 392, 3676]),
        (began, [2048, 2048, 6144, 10240]),
    ]);
    let judged = |key: &GroupKey| analysis.judge(key, 0.0).unwrap().verdict;
    // One step, then held flat through the last window: not a trend, as the report judges it.
    assert_eq!(judged(&mapped), Verdict::BoundedCache);
    assert_eq!(judged(&top), Verdict::BoundedCache);
    let grown = analysis.growing_pages(|_| 0.0, 1.0, 256 << 10);
    assert_eq!(grown, vec![began]);
    let rising = analysis.rising_pages(|_| 0.0, 1.0, 256 << 10, 4 << 20);
    assert_eq!(rising, vec![began]);
    let unexplained = analysis.unexplained_pages(|_| 0.0, 1.0, 256 << 10);
    assert_eq!(unexplained, vec![began]);
    let beyond = analysis.pages_beyond_tensors(Some(1), 0.0, 1.0, 1 << 20);
    assert_eq!(beyond, vec![began]);
}

/// What calls for a process's tensors: a brk stack whose floors rose in every window, or by
/// 4 MiB; not the heap's top moving up in steps now and then as the allocator places blocks.
#[test]
fn a_heap_top_rising_in_some_windows_only_does_not_call_for_the_tensors() {
    // Window floors as the no-leak training job's were when its tensors were asked for:
    // 2048, 3072, 3072, 4084 KiB (two 1 MiB steps), and 1472, 1472, 1680, 2068.
    let (stepped, twice) = (key(1, Kind::Brk), key(2, Kind::Brk));
    // 192, 2052, 2308, 2948 KiB: a job keeping each step's loss.
    let leak = key(3, Kind::Brk);
    // 1 MiB, 1 MiB, 6 MiB, 11 MiB: rising in some windows only, by more than 4 MiB.
    let large = key(4, Kind::Brk);
    let analysis = by_floors(&[
        (stepped, [2048, 3072, 3072, 4084]),
        (twice, [1472, 1472, 1680, 2068]),
        (leak, [192, 2052, 2308, 2948]),
        (large, [1024, 1024, 6144, 11264]),
    ]);
    let grown = analysis.growing_pages(|_| 0.0, 1.0, 256 << 10);
    assert_eq!(grown.len(), 4, "{grown:?}");
    let rising = analysis.rising_pages(|_| 0.0, 1.0, 256 << 10, 4 << 20);
    let mut stacks: Vec<_> = rising.iter().map(|k| k.stack).collect();
    stacks.sort();
    assert_eq!(stacks, vec![leak.stack, large.stack]);
    // Pages a tensor's mmap made are not the heap's top: their growth is taken as it is.
    let mapped = key(5, Kind::Mmap);
    let analysis = by_floors(&[(mapped, [2048, 3072, 3072, 4084])]);
    let rising = analysis.rising_pages(|_| 0.0, 1.0, 256 << 10, 4 << 20);
    assert_eq!(rising, vec![mapped]);
}

/// What calls for a process's malloc family: a brk stack whose heap top, rising, stayed at or
/// above every peak it reached before; not one that came back below one (the no-leak
/// transformer job's, floors 17, 20, 20, 28 MiB under peaks of 27, 39, 40, 39 MiB: its malloc
/// family, traced 5 s, found its heap held). Its tensors it calls for all the same.
#[test]
fn a_heap_top_that_came_back_below_its_reach_does_not_call_for_the_malloc_family() {
    let (swings, kept) = (key(1, Kind::Brk), key(2, Kind::Brk));
    let mapped = key(3, Kind::Mmap);
    let analysis = by_windows(&[
        (
            swings,
            [
                (17680, 27620),
                (20400, 39464),
                (20400, 41464),
                (28840, 39964),
            ],
        ),
        // A Trainer job's kept hidden states.
        (
            kept,
            [
                (25220, 36748),
                (37644, 46608),
                (46608, 54928),
                (55824, 64720),
            ],
        ),
        // A mapping's floors are what it holds: taken as they are.
        (
            mapped,
            [
                (17680, 27620),
                (20400, 39464),
                (20400, 41464),
                (28840, 39964),
            ],
        ),
    ]);
    let judged = |key: &GroupKey| analysis.judge(key, 0.0).unwrap().verdict;
    assert_eq!(judged(&swings), Verdict::Leak, "its pages read as a leak");
    let mut rising = analysis.rising_pages(|_| 0.0, 1.0, 256 << 10, 4 << 20);
    rising.sort_unstable_by_key(|k| k.stack);
    assert_eq!(rising, vec![swings, kept, mapped]);
    let mut unexplained = analysis.unexplained_pages(|_| 0.0, 1.0, 4 << 20);
    unexplained.sort_unstable_by_key(|k| k.stack);
    assert_eq!(unexplained, vec![kept, mapped]);
    let beyond = analysis.pages_beyond_tensors(Some(1), 0.0, 1.0, 1 << 20);
    assert_eq!(beyond, vec![kept, mapped]);
}

/// `--tensors auto`: a leak's tensors traced from 2 s to 8 s (1 MiB more a sample, every half
/// second), kept as they were, and traced again at 20 s, where they grow for a second more, then
/// are freed by the program's teardown; the run ends `tail` seconds after. On the chain's axis
/// the spans cover 7 s, on the run's clock 19 s: the fall 2.5 s before the end is the teardown
/// of a leak (reported, released), and one 9 s before it, memory given back while the program
/// ran on (not a leak at its exit).
#[test]
fn a_chain_of_tensors_freed_at_teardown_soon_after_they_were_traced_again_is_a_released_leak() {
    const M: u64 = 1 << 20;
    let run = |tail: f64| {
        let logits = key(1, Kind::Tensor);
        let end = 42 + (tail * 2.0) as u64;
        let after = (40..=end).map(|i| (i, if i < 42 { (i - 26) * M } else { 0 }));
        let a = kept_then_traced_again(logits, after);
        let leaks = a.released_leaks(&Default::default(), 0.0);
        leaks
            .iter()
            .any(|(k, e)| *k == logits && e.verdict == Verdict::Leak)
    };
    assert!(run(2.5), "freed at teardown");
    assert!(!run(9.0), "given back while the program ran on");
}

/// A process's tensors, sampled every 50 ms since its start, grow by 8 MiB a second from 20 s
/// on, and a mapping of its, new at 20.8 s, by 2.5 MiB a second: over the mapping's second its
/// tensors' series has points of a fifth of a second, too coarse for four windows of their own,
/// and still its tensors grew by more than half what the pages did. Those pages are not beyond
/// its tensors; with its tensors held, they are.
#[test]
fn pages_under_tensors_whose_series_is_coarser_than_theirs_are_not_beyond_them() {
    const M: f64 = (1 << 20) as f64;
    let run = |rate: f64| {
        let mut ledger = Ledger::default();
        ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
        let (tensors, pages) = (key(1, Kind::Tensor), key(2, Kind::Mmap));
        let mut a = Analysis::default();
        for i in 0..=437u64 {
            let t = i as f64 * 0.05;
            let mut groups = vec![(tensors, (8.0 * M + (t - 20.0).max(0.0) * rate) as u64)];
            if t >= 20.8 {
                groups.push((pages, (8.0 * M + (t - 20.8) * 2.5 * M) as u64));
            }
            a.sample(t, &ledger, &groups);
        }
        let coarse = classify(&a.procs[&1].tensors.until(21.9), 20.8);
        assert!(coarse.is_none(), "too coarse for windows: {coarse:?}");
        a.pages_beyond_tensors(Some(1), 20.8, 0.5, 1 << 20)
    };
    assert_eq!(run(8.0 * M), Vec::<GroupKey>::new(), "under its tensors");
    assert_eq!(run(0.0), [key(2, Kind::Mmap)], "beyond its tensors");
}

/// A process's series sampled every 50 ms for 22 s (a point every fifth of a second by then)
/// that held at 100 MiB, and a stack of its that grew by 4 MiB over the last second: the process
/// held what the stack gained, told by its first and last points where its points are too few
/// for windows; had it grown with the stack, it did not hold.
#[test]
fn a_process_series_too_coarse_for_windows_still_tells_whether_it_held() {
    const M: u64 = 1 << 20;
    let process = |rate: u64| {
        let mut s = Series::default();
        for i in 0..=437u64 {
            let t = i as f64 * 0.05;
            s.push(
                t,
                100 * M + ((t - 20.8).max(0.0) * (rate * M) as f64) as u64,
            );
        }
        s
    };
    let mut stack = Series::default();
    for i in 0..=21u64 {
        stack.push(20.8 + i as f64 * 0.05, 20 * M + i * M / 5);
    }
    let grew = classify(&stack, 20.8).unwrap();
    assert_eq!(grew.verdict, Verdict::Leak);
    assert!(
        classify(&process(0).until(21.9), 20.8).is_none(),
        "too coarse"
    );
    assert!(holds(&process(0), &grew, 20.8));
    assert!(!holds(&process(4), &grew, 20.8));
}

/// `--tensors auto`: a job's tensors kept as they were once its larger leak was confirmed, then
/// traced again. The tensors of every stack that held and rose stay: its leak's, and a smaller
/// one's that filled its last window flat (a bounded cache by its floors: an attached job's
/// validation logits, 40 KiB an epoch, beside the 1 MiB a step its graphs hold, whose stack was
/// forgotten at each retrace and missed its report in a third of the runs). A step's
/// temporaries (floors of nothing) go.
#[test]
fn tensors_traced_again_keep_every_held_rising_stack_not_a_steps() {
    let (leak, logits, step) = (
        key(1, Kind::Tensor),
        key(2, Kind::Tensor),
        key(3, Kind::Tensor),
    );
    let mut ledger = Ledger::default();
    ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
    let mut a = Analysis::default();
    const M: u64 = 1 << 20;
    a.tensors_traced_from(1, 2.0);
    for i in 4..=16u64 {
        let held = [
            (leak, (i - 3) * M),
            (logits, ((i.min(10) - 3) * 40) << 10),
            (step, if i % 2 == 0 { M } else { 0 }),
        ];
        a.sample(i as f64 / 2.0, &ledger, &held);
    }
    a.tensors_taken_out(1, 8.0, TakenOut::Kept);
    let kept = a.kept_held_stacks(1);
    assert!(kept.contains(&leak.stack), "{kept:?}");
    assert!(kept.contains(&logits.stack), "{kept:?}");
    assert!(!kept.contains(&step.stack), "{kept:?}");
}

/// `--tensors auto`: validation logits, 40 KiB a sample, kept as they were and traced again at
/// 20 s, where the first sample catches a validation pass's hidden layer of 1 MiB at their stack
/// (a step's temporary, freed a millisecond later). Their chain goes on from where it was kept,
/// by what they gain: still held and rising when kept again, not read a megabyte low for the
/// whole span (nothing at its floors, and the logits forgotten at the next retrace).
#[test]
fn a_temporary_caught_as_tensors_are_traced_again_does_not_set_where_their_chain_goes_on() {
    let logits = key(1, Kind::Tensor);
    const K: u64 = 40 << 10;
    let caught = std::iter::once((40, 13 * K + (1 << 20)));
    let after = caught.chain((41..=52u64).map(|i| (i, (i - 27) * K)));
    let mut a = kept_then_traced_again_by(logits, |i| (i - 3) * K, after);
    a.tensors_taken_out(1, 26.0, TakenOut::Kept);
    assert!(a.kept_held_stacks(1).contains(&logits.stack));
}

/// `--tensors auto`: as above, the leak's tensors freed by the teardown a second after they were
/// traced again, but kept as they were once more before the run ends (the keep came after the
/// frees it saw). Still a released leak: judged on its chain, whose fall came at its end, not on
/// the evidence of the keep (steady, its last window's floor nothing).
#[test]
fn tensors_kept_again_after_the_teardown_freed_them_are_a_released_leak() {
    const M: u64 = 1 << 20;
    let logits = key(1, Kind::Tensor);
    let after = (40..=44).map(|i| (i, if i < 42 { (i - 26) * M } else { 0 }));
    let mut a = kept_then_traced_again(logits, after);
    a.tensors_taken_out(1, 22.0, TakenOut::Kept);
    let leaks = a.released_leaks(&Default::default(), 0.0);
    assert!(
        leaks
            .iter()
            .any(|(k, e)| *k == logits && e.verdict == Verdict::Leak),
        "{leaks:?}"
    );
}

/// `--tensors auto`: as above, the temporary caught at the last sample before the logits were
/// kept as they were, not the first after they were traced again. Their chain goes on from what
/// they held, not a megabyte above it: every window's floor is whole logits.
#[test]
fn a_temporary_caught_as_tensors_are_kept_does_not_set_where_their_chain_goes_on() {
    let logits = key(1, Kind::Tensor);
    const K: u64 = 40 << 10;
    let caught = |i: u64| (i - 3) * K + if i == 16 { 1 << 20 } else { 0 };
    let after = (40..=52u64).map(|i| (i, (i - 27) * K));
    let mut a = kept_then_traced_again_by(logits, caught, after);
    a.tensors_taken_out(1, 26.0, TakenOut::Kept);
    let e = a.judge_final(&logits, 0.0).unwrap();
    assert_eq!(e.verdict, Verdict::Leak, "{e:?}");
    assert!(e.windows.iter().all(|w| w.floor % K == 0), "{e:?}");
}
