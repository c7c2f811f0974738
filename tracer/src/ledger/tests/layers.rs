//! What the ledger keeps while a layer is out (`--heap auto`, `--tensors auto`): blocks kept as
//! they were, replaced at their address without a mismatch, set aside and put back.

use super::*;

/// Tensors kept as they were while untraced stay outstanding when traced again, those of the
/// leak's stacks: a free seen
/// releases one; a new block at the address of one whose free was not seen replaces it without
/// a mismatch; a new block over a tensor made since still counts one.
#[test]
fn kept_tensors_stay_until_freed_or_their_address_is_taken() {
    let tensor = |addr, size, ts_ns| {
        Input::Event(Event {
            ts_ns,
            stack: Some(StackId::new(4)),
            ..ev(AllocFn::C10AllocCpu, What::Alloc { addr, size })
        })
    };
    let mut l = ledger(vec![
        tensor(0x5000, 4096, 10),
        tensor(0x6000, 4096, 11),
        alloc(AllocFn::C10AllocCpu, 0x7000, 4096, 5),
    ]);
    l.keep_tensors(PID, 1.0);
    // Traced again: those of the leak's stack (4) stay, the others are forgotten.
    l.forget_tensors_but(PID, |s| s == Some(StackId::new(4)));
    assert_eq!(outstanding(&l, Kind::Tensor), (8192, 2));
    l.apply(free(0x5000));
    assert_eq!(outstanding(&l, Kind::Tensor), (4096, 1));
    l.apply(tensor(0x6000, 8192, 20));
    assert_eq!(outstanding(&l, Kind::Tensor), (8192, 1));
    assert_eq!(l.procs[&PID].mismatches.reused_addresses, 0);
    l.apply(tensor(0x6000, 4096, 21));
    assert_eq!(l.procs[&PID].mismatches.reused_addresses, 1);
}

/// Heap blocks kept as they were once the malloc family was taken out (`--heap auto`) are
/// replaced without a mismatch by a new block at their address (a tensor traced later): their
/// frees were not seen. While the malloc family is traced, the same is a reused address.
#[test]
fn heap_blocks_kept_at_the_take_out_give_their_address_up_without_a_mismatch() {
    let run = |taken_out: bool| {
        let mut l = ledger(vec![alloc(AllocFn::Malloc, 0x5000, 64, 1)]);
        if taken_out {
            l.heap_taken_out(PID, 1.0, false);
        }
        l.apply(alloc(AllocFn::C10AllocCpu, 0x5000, 4096, 2));
        let p = &l.procs[&PID];
        (p.mismatches.reused_addresses, outstanding(&l, Kind::Heap))
    };
    assert_eq!(run(true), (0, (0, 0)));
    assert_eq!(run(false), (1, (0, 0)));
}

/// Traced again after it was taken out (`--heap auto`, its pages grew on): the heap blocks of
/// its leak's stack stay as they were (those made after the take-out, before the probes went
/// out, too), the others are forgotten (their frees went unseen); a new block at the address of
/// one kept replaces it without a mismatch, and its own free releases it.
#[test]
fn heap_traced_again_keeps_its_leaks_blocks_and_forgets_the_others() {
    let mut l = ledger(vec![
        alloc(AllocFn::Malloc, 0x5000, 64, 1),
        alloc(AllocFn::Malloc, 0x6000, 64, 1),
        alloc(AllocFn::Malloc, 0x7000, 32, 2),
    ]);
    l.heap_taken_out(PID, 1.0, false);
    let made = |ts_ns, stack, addr, size| {
        Input::Event(Event {
            ts_ns,
            stack: Some(StackId::new(stack)),
            ..ev(AllocFn::Malloc, What::Alloc { addr, size })
        })
    };
    // Made after the take-out, before the probes went out: its free was not seen either.
    l.apply(made(3, 1, 0x9000, 64));
    l.heap_traced_again(PID, |s| s == Some(StackId::new(1)));
    // The window before stands until this one is decided.
    let p = &l.procs[&PID];
    assert_eq!(
        (p.heap_as_of_s, p.heap_again, p.heap_retraced),
        (Some(1.0), 0, true)
    );
    assert_eq!(outstanding(&l, Kind::Heap), (192, 3));
    // 0x6000 and 0x9000 were freed while untraced and handed out again.
    let later = |addr, size| made(5, 3, addr, size);
    for addr in [0x6000, 0x9000] {
        l.apply(later(addr, 16));
        assert_eq!(l.procs[&PID].mismatches.reused_addresses, 0);
        assert_eq!(l.procs[&PID].mismatches.untraced_frees, 0);
        l.apply(free(addr));
    }
    assert_eq!(outstanding(&l, Kind::Heap), (64, 1));
    // A block made while traced again and replaced before its free came is a reuse as ever.
    l.apply(later(0x8000, 16));
    l.apply(later(0x8000, 16));
    assert_eq!(l.procs[&PID].mismatches.reused_addresses, 1);
    l.heap_taken_out(PID, 2.0, false);
    let p = &l.procs[&PID];
    assert_eq!(
        (p.heap_as_of_s, p.heap_again, p.heap_retraced),
        (Some(2.0), 1, false)
    );
}

/// Traced again just before the run ends, the window undecided: the heap is as it was when the
/// malloc family was taken out (the blocks set aside back, those made since gone), not emptied
/// of every block but its leak's.
#[test]
fn a_heap_traced_again_and_undecided_at_the_end_is_as_it_was_when_taken_out() {
    let mut l = ledger(vec![
        alloc(AllocFn::Malloc, 0x5000, 64, 1),
        alloc(AllocFn::Malloc, 0x7000, 32, 2),
    ]);
    l.heap_taken_out(PID, 1.0, true);
    l.heap_traced_again(PID, |s| s == Some(StackId::new(1)));
    assert_eq!(outstanding(&l, Kind::Heap), (64, 1));
    let later = Input::Event(Event {
        ts_ns: 5,
        stack: Some(StackId::new(3)),
        ..ev(
            AllocFn::Malloc,
            What::Alloc {
                addr: 0x9000,
                size: 16,
            },
        )
    });
    l.apply(later);
    assert_eq!(outstanding(&l, Kind::Heap), (80, 2));
    l.heap_window_undecided(PID);
    assert_eq!(outstanding(&l, Kind::Heap), (96, 2));
    assert!(l.procs[&PID].heap.get(&0x7000).is_some());
    assert!(l.procs[&PID].heap_aside.is_empty());
}

/// The pages of a large tensor kept as it was (its layer out, `--tensors auto`) unmapped: it was
/// freed, unseen, and goes. One traced has its free on its way and stays until it comes; a small
/// one (in pages of the allocator's own) is not told by its pages.
#[test]
fn a_kept_large_tensor_whose_pages_were_unmapped_goes() {
    let big = 1 << 20;
    let mut l = ledger(vec![
        mmap(0x10_0000, big + 4096, RW, 4),
        alloc(AllocFn::C10AllocCpu, 0x10_0040, big, 4),
        mmap(0x40_0000, big + 4096, RW, 4),
        alloc(AllocFn::C10AllocCpu, 0x40_0040, big, 4),
        mmap(0x80_0000, 4096, RW, 5),
        alloc(AllocFn::C10AllocCpu, 0x80_0000, 512, 5),
    ]);
    l.apply(munmap(0x40_0000, big + 4096));
    assert_eq!(
        outstanding(&l, Kind::Tensor).1,
        3,
        "traced: its free is to come"
    );
    l.apply(free(0x40_0040));
    l.keep_tensors(PID, 1.0);
    l.apply(munmap(0x10_0000, big + 4096));
    l.apply(munmap(0x80_0000, 4096));
    assert_eq!(outstanding(&l, Kind::Tensor), (512, 1));
    assert_eq!(l.procs[&PID].mismatches, Mismatches::default());
}

/// Tensors kept as they were and asked for again: the kept ones of other stacks than the held
/// ones are forgotten once they are traced, not at the asking (a process that ends before is
/// reported with its tensors as they were kept), those made after the keep and before the
/// probes went out with them; tensors made since stay whatever their stack. So are forgotten
/// those of a held stack all made within a second of the last kept: a pass's temporaries, in
/// flight as they were kept.
#[test]
fn kept_tensors_asked_for_again_are_forgotten_once_traced() {
    let tensor = |addr, stack, ts_ns| {
        Input::Event(Event {
            ts_ns,
            stack: Some(StackId::new(stack)),
            ..ev(AllocFn::C10AllocCpu, What::Alloc { addr, size: 4096 })
        })
    };
    const S: u64 = 1_000_000_000;
    let mut l = ledger(vec![
        tensor(0x5000, 4, 10),
        tensor(0x8000, 6, 2 * S - S / 10),
        tensor(0x6000, 5, 2 * S),
    ]);
    l.keep_tensors(PID, 1.0);
    l.apply(tensor(0x9000, 5, 2 * S + S / 100)); // made after the keep, before the probes went out
    let held = [4, 6].map(|s| Some(StackId::new(s)));
    l.forget_tensors_when_traced(PID, held.to_vec());
    assert_eq!(
        outstanding(&l, Kind::Tensor),
        (4 * 4096, 4),
        "asked for, not traced yet"
    );
    l.apply(tensor(0x7000, 5, 3 * S)); // made once traced, before the session saw them traced
    l.tensors_traced(PID, 2.0);
    assert_eq!(
        outstanding(&l, Kind::Tensor),
        (8192, 2),
        "the held stack's and the new one"
    );
    l.apply(free(0x7000));
    l.apply(free(0x5000));
    assert_eq!(outstanding(&l, Kind::Tensor), (0, 0));
}
