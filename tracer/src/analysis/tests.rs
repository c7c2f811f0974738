//! The analysis's verdicts on sampled series: explanations, releases, the layers' cuts.

use super::*;

fn series(values: &[u64]) -> Series {
    let mut s = Series::default();
    for (i, v) in values.iter().enumerate() {
        s.push(i as f64, *v);
    }
    s
}

fn released(values: &[u64]) -> Option<Verdict> {
    judge_released(&series(values), 0.0).map(|e| e.verdict)
}

pub(super) const K: u64 = 64 << 10;

/// Stack `s` of process 1, of `kind`.
pub(super) fn key(s: u32, kind: Kind) -> GroupKey {
    GroupKey {
        pid: 1,
        stack: Some(crate::model::StackId::new(s)),
        kind,
        inherited: false,
    }
}

/// The analysis after `n` samples of two heap stacks of one process, `a(i)` and `b(i)` bytes.
fn two_stacks(
    n: u64,
    a: impl Fn(u64) -> u64,
    b: impl Fn(u64) -> u64,
) -> (Analysis, GroupKey, GroupKey) {
    let (ka, kb) = (key(1, Kind::Heap), key(2, Kind::Heap));
    let mut analysis = Analysis::default();
    let mut ledger = Ledger::default();
    ledger.add_root(1, "app".into(), Vec::new(), 0);
    for i in 0..n {
        analysis.sample(i as f64, &ledger, &[(ka, a(i)), (kb, b(i))]);
    }
    (analysis, ka, kb)
}

/// 20 samples a second apart of a process whose brk stack grows by 512 KiB a sample, beside a
/// flat heap stack of `heap` bytes (0: none) and a stack of tensors (`tensors`: CPU tensors or
/// caching-allocator blocks) of 8 MiB that grows by `tensor_step` bytes a sample.
fn brk_beside(heap: u64, tensors: Kind, tensor_step: u64) -> (Analysis, GroupKey) {
    let mut ledger = Ledger::default();
    ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
    ledger.procs.get_mut(&1).unwrap().malloc_seen = heap > 0;
    let mut analysis = Analysis::default();
    let pages = key(1, Kind::Brk);
    for i in 0..20u64 {
        let groups = [
            (pages, (i + 1) * 8 * K),
            (key(2, Kind::Heap), heap),
            (key(3, tensors), (8 << 20) + i * tensor_step),
        ];
        analysis.sample(i as f64, &ledger, &groups);
    }
    (analysis, pages)
}

/// A ledger of one Python process (pid 1) whose malloc family is seen.
pub(super) fn worker_with_malloc_seen() -> Ledger {
    let mut ledger = Ledger::default();
    ledger.add_root(1, "python3 worker.py".into(), Vec::new(), 0);
    ledger.procs.get_mut(&1).unwrap().malloc_seen = true;
    ledger
}

/// 20 samples a second apart of a process whose malloc family is seen, its brk stack growing by
/// 512 KiB a sample and its heap stack by `heap_step` bytes.
fn brk_over_heap(heap_step: u64) -> (Analysis, GroupKey) {
    let ledger = worker_with_malloc_seen();
    let mut analysis = Analysis::default();
    let pages = key(1, Kind::Brk);
    for i in 0..20u64 {
        let heap = (1 << 20) + i * heap_step;
        analysis.sample(
            i as f64,
            &ledger,
            &[(pages, (i + 1) * 8 * K), (key(2, Kind::Heap), heap)],
        );
    }
    (analysis, pages)
}

#[test]
fn pages_a_leaking_heap_fills_are_under_the_heap() {
    let verdict = |heap_step| {
        let (a, pages) = brk_over_heap(heap_step);
        a.judge(&pages, 0.0).unwrap().verdict
    };
    // The heap leaks by half of what its pages grow by: the leak is on the heap stacks.
    assert_eq!(verdict(4 * K), Verdict::UnderHeap);
    // By less: the pages beyond it are the allocator's room around the leaking blocks.
    assert_eq!(verdict(3 * K), Verdict::UnderHeap);
    assert_eq!(verdict(K / 2), Verdict::UnderHeap);
    // Not at all: the allocator keeps pages nothing holds.
    assert_eq!(verdict(0), Verdict::Retention);
}

/// 40 samples a second apart of a process whose brk stack grows by 1 MiB a sample all along,
/// its malloc family traced from 20 s to 30 s: a heap stack grows by 1 MiB a sample in that
/// window while start-up's 3 MiB of heap garbage and 3 MiB of the heap's top go at 25 s, so
/// that neither total reads as a leak over the window (`garbage`: else neither goes).
fn window_of_a_leaking_heap(garbage: bool) -> (Analysis, GroupKey) {
    let mut ledger = Ledger::default();
    ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
    let mut analysis = Analysis::default();
    let (pages, top, heap, temp) = (
        key(1, Kind::Brk),
        key(2, Kind::Brk),
        key(3, Kind::Heap),
        key(4, Kind::Heap),
    );
    const M: u64 = 1 << 20;
    for i in 0..40u64 {
        let seen = i >= 20;
        ledger.procs.get_mut(&1).unwrap().malloc_seen = seen;
        let early = if !garbage || (20..25).contains(&i) {
            3 * M
        } else {
            0
        };
        let mut groups = vec![(pages, (8 + i) * M), (top, early)];
        if seen {
            groups.extend([(heap, (1 + i.min(30) - 20) * M), (temp, early)]);
        }
        analysis.sample(i as f64, &ledger, &groups);
        if i == 30 {
            analysis.heap_taken_out(1, 30.0);
        }
    }
    (analysis, pages)
}

#[test]
fn pages_of_a_heap_leak_seen_in_a_short_window_are_under_the_heap() {
    let (a, pages) = window_of_a_leaking_heap(true);
    let r = a.retention(1, 0.0).unwrap();
    assert!(
        r.heap != Verdict::Leak && r.pages != Verdict::Leak,
        "neither total reads as a leak over the window: {r:?}"
    );
    assert!(a.heap_leaks(1, 0.0), "its heap stack does");
    assert_eq!(a.judge(&pages, 0.0).unwrap().verdict, Verdict::UnderHeap);
    // The totals reading as leaks, as they did before.
    let (a, pages) = window_of_a_leaking_heap(false);
    assert_eq!(a.retention(1, 0.0).unwrap().heap, Verdict::Leak);
    assert_eq!(a.judge(&pages, 0.0).unwrap().verdict, Verdict::UnderHeap);
}

#[test]
fn brk_growth_is_retention_only_where_the_malloc_family_is_seen() {
    // Heap blocks seen and flat: the allocator keeps pages nothing holds.
    let (seen, pages) = brk_beside(1 << 20, Kind::Tensor, 0);
    assert_eq!(seen.judge(&pages, 0.0).unwrap().verdict, Verdict::Retention);
    assert!(seen.retention(1, 0.0).unwrap().retention);
    // Tensors alone (the malloc family not traced): the growth is unexplained, a leak; and
    // pages grown for over 10 s by 4 MiB call for the malloc family.
    let (unseen, pages) = brk_beside(0, Kind::Tensor, 0);
    assert_eq!(unseen.judge(&pages, 0.0).unwrap().verdict, Verdict::Leak);
    assert!(unseen.retention(1, 0.0).is_none());
    assert_eq!(unseen.growing_pages(|_| 0.0, 10.0, 4 << 20), vec![pages]);
    assert!(
        unseen.growing_pages(|_| 0.0, 20.0, 4 << 20).is_empty(),
        "a 19 s span"
    );
    // Growth is floor to floor of the first and last windows: 7.5 MiB.
    assert!(unseen.growing_pages(|_| 0.0, 10.0, 8 << 20).is_empty());
    // Made by a library's import (a slow `import torch`): the module's state, no call for a
    // layer.
    let (mut imported, pages) = brk_beside(0, Kind::Tensor, 0);
    imported.imported(pages.stack.unwrap());
    assert!(imported.growing_pages(|_| 0.0, 10.0, 4 << 20).is_empty());
    assert!(
        imported
            .unexplained_pages(|_| 0.0, 10.0, 4 << 20)
            .is_empty()
    );
    // Tensors growing as fast: the pages hold them; the leak, if any, is on the tensors.
    // So for tensors on the GPU: the host pages hold their Python objects and autograd nodes.
    for kind in [Kind::Tensor, Kind::TorchBlock] {
        let (under, pages) = brk_beside(0, kind, 8 * K);
        assert_eq!(
            under.judge(&pages, 0.0).unwrap().verdict,
            Verdict::UnderTensors,
            "{kind:?}"
        );
        let (slower, pages) = brk_beside(0, kind, 2 * K);
        assert_eq!(slower.judge(&pages, 0.0).unwrap().verdict, Verdict::Leak);
    }
    // Device memory without PyTorch's blocks explains no host pages.
    let (device, pages) = brk_beside(0, Kind::Device, 8 * K);
    assert_eq!(device.judge(&pages, 0.0).unwrap().verdict, Verdict::Leak);
}

#[test]
fn the_heap_top_moving_up_once_at_the_end_is_not_a_leak_of_pages() {
    // A 16 MiB scratch buffer every other sample; in the last window it stays above the
    // others: the window floors go 16, 16, 16, 32 MiB while the peaks hold at 47.
    let m = |n: u64| n << 20;
    let bytes = |i: u64| match (i % 2, i >= 15) {
        (1, _) => m(47),
        (_, false) => m(16),
        (_, true) => m(32),
    };
    let (pages, blocks) = (key(1, Kind::Brk), key(2, Kind::Heap));
    let mut ledger = Ledger::default();
    ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
    let mut analysis = Analysis::default();
    for i in 0..20u64 {
        analysis.sample(i as f64, &ledger, &[(pages, bytes(i)), (blocks, bytes(i))]);
    }
    // Blocks that stay are blocks kept; the heap's top is where the allocator put the last.
    assert_eq!(analysis.judge(&blocks, 0.0).unwrap().verdict, Verdict::Leak);
    assert_eq!(
        analysis.judge(&pages, 0.0).unwrap().verdict,
        Verdict::Steady
    );
    // The same, its top floating up by less than a tenth before (16, 16.4, 16.9, 32 MiB): the
    // spike control's pages, seen while its tensors were not traced.
    let floated = |i: u64| match (i % 2, i >= 15) {
        (1, _) => m(47),
        (_, false) => m(16) + (i / 5) * m(1) * 2 / 5,
        (_, true) => m(32),
    };
    let mut analysis = Analysis::default();
    for i in 0..20u64 {
        analysis.sample(i as f64, &ledger, &[(pages, floated(i))]);
    }
    let e = analysis.judge(&pages, 0.0).unwrap();
    assert_eq!(
        e.windows.iter().filter(|w| w.floor > m(16)).count(),
        3,
        "{e:?}"
    );
    assert_eq!(e.verdict, Verdict::Steady);
    // Up by 132 KiB once, then by 3 MiB in the last window (532, 664, 664, 3736 KiB): the
    // no-leak training job's heap top, its late move over a validation's block.
    let k = |n: u64| n << 10;
    let late = |i: u64| match i {
        0..5 => k(532),
        5..15 => k(664),
        _ => k(3736),
    };
    let mut analysis = Analysis::default();
    for i in 0..20u64 {
        analysis.sample(i as f64, &ledger, &[(pages, late(i))]);
    }
    assert_eq!(
        analysis.judge(&pages, 0.0).unwrap().verdict,
        Verdict::Steady
    );
    // Moving up in every window, it is a leak of pages.
    let (unseen, pages) = brk_beside(0, Kind::Tensor, 0);
    assert_eq!(unseen.judge(&pages, 0.0).unwrap().verdict, Verdict::Leak);
}

#[test]
fn a_large_heap_top_floating_by_less_than_a_tenth_is_not_a_leak_of_pages() {
    // The spike control's brk stack: a 16 MiB scratch buffer, its heap's top floating from
    // 16 to 17.5 MiB in steps between the spikes.
    let m = |n: u64| n << 20;
    let bytes = |i: u64| match i % 2 {
        1 => m(48),
        _ => m(16) + (i / 5) * m(1) / 2,
    };
    let (pages, heap) = (key(1, Kind::Brk), key(1, Kind::Heap));
    let run = |f: &dyn Fn(u64) -> u64| {
        let mut ledger = Ledger::default();
        ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
        let mut analysis = Analysis::default();
        for i in 0..20u64 {
            analysis.sample(i as f64, &ledger, &[(pages, f(i))]);
        }
        analysis.judge(&pages, 0.0).unwrap().verdict
    };
    assert_eq!(run(&bytes), Verdict::Steady);
    // Rising by a MiB a window from 4 MiB: growth, whatever its size.
    assert_eq!(run(&|i| m(4) + (i / 5) * m(1)), Verdict::Leak);
    // The heap kind keeps the classifier's rule.
    let mut ledger = Ledger::default();
    ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
    let mut analysis = Analysis::default();
    for i in 0..20u64 {
        analysis.sample(i as f64, &ledger, &[(heap, bytes(i))]);
    }
    assert_ne!(analysis.judge(&heap, 0.0).unwrap().verdict, Verdict::Steady);
}

#[test]
fn pages_kept_after_their_stacks_tensors_were_freed_are_retention() {
    // The spike control as CI once saw it: a 16 MiB tensor made and freed every step, and
    // the heap's top held higher window after window by something small allocated above
    // its pages. The tensors of that line hold 0 or 16 MiB, never more.
    let m = |n: u64| n << 20;
    let run = |tensors: &dyn Fn(u64) -> u64| {
        let mut ledger = Ledger::default();
        ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
        let mut analysis = Analysis::default();
        let (pages, blocks) = (key(5, Kind::Brk), key(5, Kind::Tensor));
        for i in 0..20u64 {
            let held = m(16) + (i / 5) * m(8);
            let groups = [(pages, held + (i % 2) * m(16)), (blocks, tensors(i))];
            analysis.sample(i as f64, &ledger, &groups);
        }
        analysis.judge(&pages, 0.0).unwrap().verdict
    };
    assert_eq!(run(&|i| (i % 2) * m(16)), Verdict::Retention);
    // Tensors of that line kept as the pages grow: the pages are theirs (judged under them).
    assert_eq!(run(&|i| (i / 5) * m(8)), Verdict::UnderTensors);
}

#[test]
fn pages_grown_for_a_small_tensor_while_the_heap_fills_call_for_the_malloc_family() {
    // A loop keeping each step's autograd nodes (malloc's): the heap's top crosses into new
    // pages at whatever allocation comes next, often a step's 128 KiB gradient, so the pages
    // have its stack. Its tensors hold 128 KiB; the pages grow by 12 MiB: more than the
    // allocator keeps for them, growth that calls for the malloc family. Judged at the end
    // without it, they are retention still: a spike's tensor is seldom sampled at its peak.
    let mut ledger = Ledger::default();
    ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
    let mut analysis = Analysis::default();
    let (pages, blocks) = (key(5, Kind::Brk), key(5, Kind::Tensor));
    for i in 0..20u64 {
        let groups = [(pages, (i + 1) * 10 * K), (blocks, 2 * K)];
        analysis.sample(i as f64, &ledger, &groups);
    }
    assert_eq!(analysis.growing_pages(|_| 0.0, 10.0, 1 << 20), vec![pages]);
    assert_eq!(
        analysis.judge(&pages, 0.0).unwrap().verdict,
        Verdict::Retention
    );
}

#[test]
fn a_brk_stack_rising_while_the_heaps_top_holds_is_the_top_moving_not_a_leak() {
    // glibc grows and trims the heap's top by megabytes; the pages above belong to whichever
    // allocation grew it last. Stack 5 gains 2 MiB over the run as stack 6 gives as much back:
    // the process's brk holds. Where it grows with stack 5, stack 5 leaks.
    // The pages are judged whole where the malloc family was taken out early (`heap_out`): its
    // pages are still traced after it.
    let run = |others_fall: bool, heap_out: Option<f64>| {
        let mut ledger = Ledger::default();
        ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
        let mut analysis = Analysis::default();
        let (rising, other) = (key(5, Kind::Brk), key(6, Kind::Brk));
        for i in 0..20u64 {
            let gained = i * 2 * K;
            let rest = if others_fall { 64 * K - gained } else { 64 * K };
            analysis.sample(i as f64, &ledger, &[(rising, gained), (other, rest)]);
        }
        if let Some(x) = heap_out {
            analysis.heap_taken_out(1, x);
        }
        analysis.judge_final(&rising, 0.0).unwrap().verdict
    };
    assert_eq!(run(true, None), Verdict::Moved);
    assert_eq!(run(false, None), Verdict::Leak);
    assert_eq!(run(false, Some(4.0)), Verdict::Leak);
}

#[test]
fn a_fall_at_the_end_is_teardown_only_below_the_last_floor() {
    // Rising for 19 samples, then freed at teardown but for a block: judged before the fall.
    let (a, key, _) = two_stacks(20, |i| if i < 19 { (i + 1) * 8 * K } else { K }, |_| 0);
    assert_eq!(a.judge_final(&key, 0.0).unwrap().verdict, Verdict::Leak);
    assert_ne!(a.judge(&key, 0.0).unwrap().verdict, Verdict::Leak);
    // A cache of 64 blocks flushed to 48 on its beat, the last time just before the end:
    // judged whole, as during the run.
    let cache = |i: u64| if i % 5 == 4 { 48 * K } else { 64 * K };
    let (a, key, _) = two_stacks(
        20,
        |i| if i < 3 { (i + 1) * 16 * K } else { cache(i) },
        |_| 0,
    );
    let whole = a.judge(&key, 0.0).unwrap().verdict;
    assert_eq!(a.judge_final(&key, 0.0).unwrap().verdict, whole);
    assert_ne!(whole, Verdict::Leak);
}

#[test]
fn pages_under_tensors_do_not_call_for_the_malloc_family() {
    let mut ledger = Ledger::default();
    ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
    let mut analysis = Analysis::default();
    for i in 0..20u64 {
        let bytes = (i + 1) * 4 * K;
        let groups = [(key(7, Kind::Brk), bytes), (key(7, Kind::Tensor), bytes)];
        analysis.sample(i as f64, &ledger, &groups);
    }
    assert!(analysis.growing_pages(|_| 0.0, 10.0, 1 << 20).is_empty());
}

#[test]
fn segments_under_pytorchs_caching_allocator_are_its_cache_not_a_second_leak() {
    let (blocks, segments) = (key(1, Kind::TorchBlock), key(2, Kind::Device));
    let mut ledger = Ledger::default();
    ledger.add_root(1, "train".into(), Vec::new(), 0);
    let run = |with_blocks: bool| {
        let mut analysis = Analysis::default();
        for i in 0..20u64 {
            let mut groups = vec![(segments, (i + 1) * 2 * K)];
            if with_blocks {
                groups.push((blocks, (i + 1) * K));
            }
            analysis.sample(i as f64, &ledger, &groups);
        }
        analysis
    };
    let analysis = run(true);
    assert_eq!(
        analysis.judge(&blocks, 0.0).map(|e| e.verdict),
        Some(Verdict::Leak)
    );
    assert_eq!(
        analysis.judge(&segments, 0.0).map(|e| e.verdict),
        Some(Verdict::Retention)
    );
    // cudaMalloc without the caching allocator: device memory is judged as itself.
    let analysis = run(false);
    assert_eq!(
        analysis.judge(&segments, 0.0).map(|e| e.verdict),
        Some(Verdict::Leak)
    );
}

#[test]
fn records_moving_from_the_load_path_to_the_update_path_are_not_a_leak() {
    // 2 MiB loaded at start-up from one call site, replaced record by record from another:
    // the update path rises, the load path falls, the process holds the same.
    let total = 32 * K;
    let moved = |i: u64| (total * i / 20).min(total);
    let (analysis, load, update) = two_stacks(20, |i| total - moved(i), moved);
    assert_eq!(
        analysis.judge(&update, 0.0).map(|e| e.verdict),
        Some(Verdict::Moved)
    );
    assert_ne!(
        analysis.judge(&load, 0.0).map(|e| e.verdict),
        Some(Verdict::Leak)
    );
    // The same rise beside a steady stack: the process grows with it, a leak.
    let (analysis, _, leak) = two_stacks(20, |_| total, moved);
    assert_eq!(
        analysis.judge(&leak, 0.0).map(|e| e.verdict),
        Some(Verdict::Leak)
    );
    // Beside a stack that falls by far more (start-up garbage collected under the leak): the
    // process falls, it does not hold, and the rise is a leak.
    let (analysis, _, leak) = two_stacks(20, |i| 8 * total - 4 * moved(i), moved);
    assert_eq!(
        analysis.judge(&leak, 0.0).map(|e| e.verdict),
        Some(Verdict::Leak)
    );
}

#[test]
fn a_leak_freed_at_the_end_is_judged_on_what_it_held() {
    let grow: Vec<u64> = (1..=20).map(|i| i * K).collect();
    // All at once, or over a few samples, at the end.
    assert_eq!(
        released(&[grow.clone(), vec![0]].concat()),
        Some(Verdict::Leak)
    );
    let teardown = vec![12 * K, 3 * K, 0, 0];
    assert_eq!(
        released(&[grow.clone(), teardown].concat()),
        Some(Verdict::Leak)
    );
    // The whole series, fall included, reads otherwise: that was the defect.
    let whole = classify(&series(&[grow.clone(), vec![0, 0, 0]].concat()), 0.0);
    assert_ne!(whole.map(|e| e.verdict), Some(Verdict::Leak));
    assert_eq!(
        released(&[grow, vec![0, 0, 0]].concat()),
        Some(Verdict::Leak)
    );
}

#[test]
fn memory_released_long_before_the_end_or_never_leaking_is_not_a_released_leak() {
    // Grown during loading, then dropped, and the run went on three times as long.
    let grow: Vec<u64> = (1..=10).map(|i| i * K).collect();
    let late = [grow, vec![0; 30]].concat();
    assert_ne!(released(&late), Some(Verdict::Leak));
    // A buffer filled and flushed again and again, flushed at the end too.
    let saw: Vec<u64> = (0..24).map(|i| (i % 6) * 8 * K).collect();
    assert_ne!(released(&[saw, vec![0]].concat()), Some(Verdict::Leak));
    // A cache that fills, holds, and is cleared at exit.
    let cache: Vec<u64> = (1..=24).map(|i| i.min(6) * 8 * K).collect();
    assert_ne!(released(&[cache, vec![0]].concat()), Some(Verdict::Leak));
}

/// `--tensors auto`, a tensor leak confirmed: its tensors taken out and kept as they were are
/// judged up to then (they are flat since), and the pages grown since at the leak's rate are the
/// leak's, while pages that grow four times faster are not; traced again, the chain of both spans
/// is judged: a leak that stopped while its quiet stretch is shorter than its growth, not after.
#[test]
fn kept_tensors_are_judged_until_kept_and_explain_the_pages_grown_since() {
    let mut ledger = Ledger::default();
    ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
    let (tensors, pages, faster) = (key(1, Kind::Tensor), key(2, Kind::Brk), key(3, Kind::Brk));
    let mut a = Analysis::default();
    const M: u64 = 1 << 20;
    // Samples every half second: pages grow by 1 MiB a sample all along; the tensors are
    // traced from 2 s, grow by 1 MiB a sample, and are kept at 8 s.
    let sample = |a: &mut Analysis, i: u64, held: u64| {
        let groups = [
            (tensors, held),
            (pages, (i + 1) * M),
            (faster, (i + 1) * 4 * M),
        ];
        a.sample(i as f64 / 2.0, &ledger, &groups);
    };
    for i in 0..40u64 {
        if i == 4 {
            a.tensors_traced_from(1, 2.0);
        }
        if i == 16 {
            a.tensors_taken_out(1, 8.0, TakenOut::Kept);
        }
        sample(&mut a, i, i.clamp(4, 15).saturating_sub(4) * M + M);
    }
    let t = a.judge(&tensors, 0.0).expect("judged");
    assert_eq!(t.verdict, Verdict::Leak);
    assert!(span(&t) <= 5.0, "judged up to when they were kept: {t:?}");
    assert_eq!(a.judge(&pages, 0.0).unwrap().verdict, Verdict::UnderTensors);
    assert_eq!(a.judge(&faster, 0.0).unwrap().verdict, Verdict::Leak);
    let grown = a.unexplained_pages(|_| 0.0, 1.0, 1);
    assert_eq!(grown, vec![faster], "what calls for the malloc family");
    let mut grown = a.growing_pages(|_| 0.0, 1.0, 1);
    grown.sort_unstable_by_key(|k| k.stack);
    assert_eq!(grown, vec![pages, faster], "what grows");

    // Traced again at 20 s: those kept were kept (12 MiB) and hold, for 2 s: on the chain (the
    // first span, then this one), a growth then a shorter quiet stretch, a leak still, its
    // windows on the series' axis; but it did not grow in this span.
    a.tensors_traced_from(1, 20.0);
    for i in 40..44u64 {
        sample(&mut a, i, 12 * M);
    }
    let t = a.judge(&tensors, 0.0).unwrap();
    assert_eq!(t.verdict, Verdict::Leak);
    let last = t.windows.last().unwrap();
    assert!(last.t1_s > 20.0 && last.t1_s < 22.0, "{t:?}");
    assert!(a.tensors_leak(1).is_some());
    assert!(!a.tensors_grew(1));
    assert_eq!(a.judge(&pages, 0.0).unwrap().verdict, Verdict::UnderTensors);
    // Kept as they were judged, their leak stopped: judged so while traced again too.
    a.tensors_taken_out(1, 22.0, TakenOut::Stopped(40.0));
    assert!(a.kept_leak_stopped(1));
    assert_eq!(a.judge(&tensors, 0.0).unwrap().verdict, Verdict::Leak);
    a.tensors_traced_from(1, 24.0);
    for i in 48..56u64 {
        sample(&mut a, i, 12 * M);
    }
    assert_eq!(a.judge(&tensors, 0.0).unwrap().verdict, Verdict::Leak);
    // Quiet for longer than they grew, on the chain: a cache that filled; forgotten, the chain
    // ends, and with it what the kept span told.
    assert_eq!(a.tensors_leak(1), None);
    a.tensors_taken_out(1, 28.0, TakenOut::Forgotten);
    assert!(
        a.judge(&tensors, 0.0).is_none(),
        "not judged while taken out"
    );
    assert_ne!(a.judge(&pages, 0.0).unwrap().verdict, Verdict::UnderTensors);
}

#[test]
fn a_brk_stack_rising_under_a_heap_top_that_held_is_steady() {
    // The no-leak training job's heap as caught failing: its top at 144 MiB in every window,
    // its floors 140, 141, 142, 143 MiB (glibc trimming less often), and its validation line's
    // stack holding 0, 0, 2, 3 MiB of it at the floors.
    let m = |n: u64| n << 20;
    let floors_a = [0, 0, 2, 3];
    let run = |top_rise: u64| {
        let (a, b) = (key(1, Kind::Brk), key(2, Kind::Brk));
        let mut ledger = Ledger::default();
        ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
        let mut analysis = Analysis::default();
        for i in 0..20u64 {
            let w = i / 5;
            let (total, at_a) = match i % 2 {
                1 => (m(144 + w * top_rise), m(floors_a[w as usize] + 1)),
                _ => (m(140 + w), m(floors_a[w as usize])),
            };
            analysis.sample(i as f64, &ledger, &[(a, at_a), (b, total - at_a)]);
        }
        analysis.judge(&a, 0.0).unwrap().verdict
    };
    assert_eq!(run(0), Verdict::Steady);
    // The top rising with it, a MiB a window: a leak of pages.
    assert_eq!(run(1), Verdict::Leak);
}

#[test]
fn a_brk_stack_whose_floor_drifts_under_spikes_is_a_spike() {
    // The spike control as caught failing once: a 16 MiB scratch tensor made and dropped every
    // step in the brk heap, its stack's floors 0, 256, 640, 896 KiB as glibc placed it a little
    // higher now and then, beside 40 MiB that holds.
    let k = |n: u64| n << 10;
    let run = |floors: [u64; 4]| {
        let (a, b) = (key(1, Kind::Brk), key(2, Kind::Brk));
        let mut ledger = Ledger::default();
        ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
        let mut analysis = Analysis::default();
        for i in 0..20u64 {
            let floor = floors[(i / 5) as usize];
            let at_a = if i % 2 == 1 {
                floor + k(16 << 10)
            } else {
                floor
            };
            analysis.sample(i as f64, &ledger, &[(a, at_a), (b, k(40 << 10))]);
        }
        analysis.judge(&a, 0.0).unwrap().verdict
    };
    assert_eq!(run([0, k(256), k(640), k(896)]), Verdict::Spike);
    // Floors rising by 4 MiB a window under the same spikes: a leak of pages.
    assert_eq!(run([0, k(4 << 10), k(8 << 10), k(12 << 10)]), Verdict::Leak);
}

/// An interpreter's exit: a stack that rose for 20 samples, then, from when its interpreter began
/// its exit, rose further at once and held for 40 samples (an exit handler's objects in the same
/// pages, held while it waits) before falling back a little. Judged on the whole run, the flat
/// teardown reads as a cache that filled; judged on the samples before the exit, a leak.
#[test]
fn what_an_interpreters_exit_makes_is_not_judged() {
    let run = |exits: bool| {
        let mut ledger = Ledger::default();
        ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
        let mut a = Analysis::default();
        let pages = key(1, Kind::Mmap);
        for i in 0..61u64 {
            if i == 20 && exits {
                ledger.procs.get_mut(&1).unwrap().finalized_ns = Some(1);
            }
            let held = match i {
                0..20 => (i + 1) * 8 * K,
                20..60 => 480 * K,
                _ => 400 * K,
            };
            a.sample(i as f64, &ledger, &[(pages, held)]);
        }
        a.judge_final(&pages, 0.0).unwrap().verdict
    };
    assert_eq!(run(true), Verdict::Leak);
    assert_ne!(run(false), Verdict::Leak);
}

/// A program that embeds the interpreter, finalizes it at 20 s and runs on for 100 s, its pages
/// flat before and rising after: judged on the whole run once it has gone on for longer than a
/// teardown takes.
#[test]
fn a_program_that_runs_on_after_finalizing_its_interpreter_is_judged_whole() {
    let mut ledger = Ledger::default();
    ledger.add_root(1, "app".into(), Vec::new(), 0);
    let mut a = Analysis::default();
    let pages = key(1, Kind::Mmap);
    for i in 0..120u64 {
        if i == 20 {
            ledger.procs.get_mut(&1).unwrap().finalized_ns = Some(1);
        }
        let held = 64 * K + i.saturating_sub(20) * 8 * K;
        a.sample(i as f64, &ledger, &[(pages, held)]);
        if i == 60 {
            assert_ne!(a.judge(&pages, 0.0).unwrap().verdict, Verdict::Leak);
        }
    }
    assert_eq!(a.judge(&pages, 0.0).unwrap().verdict, Verdict::Leak);
}

/// `--tensors auto`: a cache that filled, its leak confirmed and kept as it was at the sample
/// that confirmed it (the last point of its span, where the next span begins on the chain, a
/// sample above the one before), then traced again once it holds: on its chain a leak still,
/// but it did not grow in the new span.
#[test]
fn a_cache_kept_at_its_confirming_sample_and_holding_since_did_not_grow_when_traced_again() {
    const M: u64 = 1 << 20;
    // It holds its 13 MiB from then on.
    let a = kept_then_traced_again(key(1, Kind::Tensor), (40..48u64).map(|i| (i, 13 * M)));
    assert!(a.tensors_leak(1).is_some(), "a leak on its chain");
    assert!(!a.tensors_grew(1), "it held in this span");
}

/// `--tensors auto`: the tensor stack `at` of process 1 sampled every half second: traced from
/// 2 s, 1 MiB more each sample; kept after the sample at 8 s, at 13 MiB, which it holds while
/// untraced; traced again at 20 s, then sampled as `after` says (the sample's index, 40 at 20 s,
/// and what it holds).
pub(super) fn kept_then_traced_again(
    at: GroupKey,
    after: impl Iterator<Item = (u64, u64)>,
) -> Analysis {
    kept_then_traced_again_by(at, |i| (i - 3) << 20, after)
}

/// As [`kept_then_traced_again`], holding `before(i)` at each sample `i` of the first span
/// (4 to 16), and `before(16)` while untraced.
pub(super) fn kept_then_traced_again_by(
    at: GroupKey,
    before: impl Fn(u64) -> u64,
    after: impl Iterator<Item = (u64, u64)>,
) -> Analysis {
    let mut ledger = Ledger::default();
    ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
    let mut a = Analysis::default();
    let sample = |a: &mut Analysis, i: u64, held: u64| {
        a.sample(i as f64 / 2.0, &ledger, &[(at, held)]);
    };
    a.tensors_traced_from(1, 2.0);
    for i in 4..=16u64 {
        sample(&mut a, i, before(i));
    }
    a.tensors_taken_out(1, 8.0, TakenOut::Kept);
    for i in 17..40u64 {
        sample(&mut a, i, before(16));
    }
    a.tensors_traced_from(1, 20.0);
    for (i, held) in after {
        sample(&mut a, i, held);
    }
    a
}

/// `--tensors auto`: an accumulator grown by copying (`acc = torch.cat([acc, x])`, one block
/// made anew every step) kept as it was, then traced again: its stack holds one block, grown by
/// all it gained while untraced. On the chain it goes on from where it was kept, by what it gains
/// in the new span: still a leak, and it grew in this span. Taken as it is, the chain would
/// jump, and read as a cache that filled in one window.
#[test]
fn an_accumulator_traced_again_goes_on_from_where_its_chain_was_kept() {
    let mut ledger = Ledger::default();
    ledger.add_root(1, "python3 eval.py".into(), Vec::new(), 0);
    let acc = key(1, Kind::Tensor);
    let mut a = Analysis::default();
    const M: u64 = 1 << 20;
    // Samples every half second; the accumulator gains 1 MiB a sample all along.
    let sample = |a: &mut Analysis, i: u64| a.sample(i as f64 / 2.0, &ledger, &[(acc, i * M)]);
    a.tensors_traced_from(1, 2.0);
    for i in 4..12u64 {
        sample(&mut a, i);
    }
    assert!(a.tensors_leak(1).is_some_and(|s| s >= 2.0));
    a.tensors_taken_out(1, 6.0, TakenOut::Kept);
    // Untraced: kept as it was (its pages unmapped, the block went: see the ledger).
    for i in 12..40u64 {
        a.sample(i as f64 / 2.0, &ledger, &[]);
    }
    a.tensors_traced_from(1, 20.0);
    for i in 40..48u64 {
        sample(&mut a, i);
    }
    assert!(a.tensors_leak(1).is_some(), "a leak on its chain");
    assert!(a.tensors_grew(1), "it grew in this span");
}

#[test]
fn a_released_brk_stacks_small_rise_in_a_large_heap_is_no_leak() {
    // A brk stack that rose 9 MiB and was freed at the end, beside `heap` bytes that held: in a
    // heap of 1 MiB a leak released at teardown, in one of 200 MiB (a PyTorch job's) the top
    // moving up, as for a stack still outstanding.
    let run = |heap: u64| {
        let (rising, held) = (key(1, Kind::Brk), key(2, Kind::Brk));
        let mut ledger = Ledger::default();
        ledger.add_root(1, "python3 train.py".into(), Vec::new(), 0);
        let mut analysis = Analysis::default();
        for i in 0..20u64 {
            let at = if i < 19 { i * 8 * K } else { 0 };
            analysis.sample(i as f64, &ledger, &[(rising, at), (held, heap)]);
        }
        let outstanding = [held].into_iter().collect();
        let leaks = analysis.released_leaks(&outstanding, 0.0);
        leaks.iter().any(|(k, _)| *k == rising)
    };
    assert!(run(1 << 20));
    assert!(!run(200 << 20));
}
