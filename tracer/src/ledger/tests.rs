//! Ledger semantics on synthetic event sequences.

use std::sync::Arc;

use tracer_common::{AllocFn, EventKind};

use super::*;
use crate::ingest::{Decoded, Frame, Input, StackId};

const PID: u32 = 100;
const MAP_ANON_PRIVATE: u64 = 0x22;
const RW: u64 = 3;

fn ev(kind: EventKind, func: AllocFn) -> Decoded {
    Decoded {
        kind,
        func: Some(func),
        tgid: PID,
        ts_ns: 1,
        addr: 0,
        size: 0,
        old_addr: 0,
        old_size: 0,
        aux: 0,
        stack: Some(StackId(1)),
        command: None,
    }
}

fn alloc(func: AllocFn, addr: u64, size: u64, stack: u32) -> Input {
    Input::Event(Decoded {
        addr,
        size,
        stack: Some(StackId(stack)),
        ..ev(EventKind::Alloc, func)
    })
}
fn free(addr: u64) -> Input {
    Input::Event(Decoded {
        old_addr: addr,
        stack: None,
        ..ev(EventKind::Free, AllocFn::Free)
    })
}
fn realloc(old: u64, new: u64, size: u64, stack: u32) -> Input {
    Input::Event(Decoded {
        old_addr: old,
        addr: new,
        size,
        stack: Some(StackId(stack)),
        ..ev(EventKind::Realloc, AllocFn::Realloc)
    })
}
fn mmap(addr: u64, len: u64, prot: u64, stack: u32) -> Input {
    let aux = (prot << 32) | MAP_ANON_PRIVATE;
    Input::Event(Decoded {
        addr,
        size: len,
        aux,
        stack: Some(StackId(stack)),
        ..ev(EventKind::Mmap, AllocFn::Mmap)
    })
}
fn munmap(addr: u64, len: u64) -> Input {
    Input::Event(Decoded {
        old_addr: addr,
        old_size: len,
        ..ev(EventKind::Munmap, AllocFn::Munmap)
    })
}
fn mprotect(addr: u64, len: u64, prot: u64) -> Input {
    Input::Event(Decoded {
        old_addr: addr,
        old_size: len,
        aux: prot,
        ..ev(EventKind::Mprotect, AllocFn::Mprotect)
    })
}
fn brk(result: u64, stack: u32) -> Input {
    Input::Event(Decoded {
        addr: result,
        stack: Some(StackId(stack)),
        ..ev(EventKind::Brk, AllocFn::Brk)
    })
}

fn ledger(inputs: Vec<Input>) -> Ledger {
    let mut l = Ledger::default();
    l.add_root(PID, "fixture".into(), 0);
    for s in 1..=9 {
        let frames: Arc<[Frame]> = Arc::from(vec![Frame {
            module: None,
            offset: s,
            addr: s,
        }]);
        l.apply(Input::Stack {
            id: StackId(s as u32),
            frames,
            truncated: false,
        });
    }
    inputs.into_iter().for_each(|i| l.apply(i));
    l
}

/// (bytes, blocks) of `kind` for `stack`.
fn of(l: &Ledger, kind: Kind, stack: u32) -> (u64, u64) {
    l.groups()
        .iter()
        .filter(|g| g.kind == kind && g.stack == Some(StackId(stack)))
        .fold((0, 0), |(b, n), g| (b + g.bytes, n + g.blocks))
}

#[test]
fn malloc_free_and_unmatched_free() {
    let l = ledger(vec![
        alloc(AllocFn::Malloc, 0x10, 100, 1),
        alloc(AllocFn::Malloc, 0x20, 50, 1),
        free(0x10),
        free(0x999),
    ]);
    assert_eq!(of(&l, Kind::Heap, 1), (50, 1));
    assert_eq!(l.procs[&PID].mismatches.unmatched_frees, 1);
}

#[test]
fn realloc_grow_shrink_move_null_and_zero() {
    let l = ledger(vec![
        alloc(AllocFn::Malloc, 0x10, 100, 1),
        realloc(0x10, 0x10, 1000, 2), // grow in place
        realloc(0x10, 0x80, 5000, 3), // move
        realloc(0x80, 0x80, 10, 4),   // shrink
        realloc(0, 0x200, 777, 5),    // realloc(NULL, n)
        alloc(AllocFn::Malloc, 0x300, 300, 6),
        realloc(0x300, 0, 0, 6), // realloc(p, 0) frees
    ]);
    assert_eq!(
        of(&l, Kind::Heap, 4),
        (10, 1),
        "the block belongs to the last realloc"
    );
    assert_eq!(of(&l, Kind::Heap, 3), (0, 0));
    assert_eq!(of(&l, Kind::Heap, 5), (777, 1));
    assert_eq!(of(&l, Kind::Heap, 6), (0, 0));
    assert_eq!(l.procs[&PID].mismatches.unmatched_frees, 0);
}

#[test]
fn pvalloc_rounds_to_pages() {
    let l = ledger(vec![alloc(AllocFn::Pvalloc, 0x1000, 5000, 1)]);
    assert_eq!(of(&l, Kind::Heap, 1), (8192, 1));
}

#[test]
fn arena_reservation_counts_only_what_mprotect_opens() {
    // glibc's new_heap: reserve 128 MiB without access, trim to an aligned 64 MiB, open 132 KiB.
    let base = 0x7f00_0000_0000u64;
    let l = ledger(vec![
        mmap(base, 128 << 20, 0, 1),
        munmap(base, 12 << 20),
        munmap(base + (76 << 20), 52 << 20),
        mprotect(base + (12 << 20), 135168, RW),
    ]);
    assert_eq!(of(&l, Kind::Mmap, 1), (135168, 1));
    assert_eq!(l.procs[&PID].mismatches.unmatched_unmap_bytes, 0);
}

#[test]
fn partial_munmap_and_mremap() {
    let l = ledger(vec![
        mmap(0x10000, 10 * 4096, RW, 1),
        munmap(0x10000 + 4 * 4096, 2 * 4096),
        mmap(0x100000, 4 * 4096, RW, 2),
        Input::Event(Decoded {
            old_addr: 0x100000,
            old_size: 4 * 4096,
            addr: 0x200000,
            size: 16 * 4096,
            stack: Some(StackId(3)),
            ..ev(EventKind::Mremap, AllocFn::Mremap)
        }),
    ]);
    assert_eq!(of(&l, Kind::Mmap, 1), (8 * 4096, 2));
    assert_eq!(
        of(&l, Kind::Mmap, 2),
        (16 * 4096, 1),
        "mremap keeps the mapping's origin"
    );
}

#[test]
fn brk_growth_and_shrink() {
    let l = ledger(vec![
        brk(0x5000_0000, 1),
        brk(0x5002_0000, 2),
        brk(0x5003_0000, 3),
        brk(0x5002_8000, 4),
    ]);
    assert_eq!(of(&l, Kind::Brk, 2), (0x20000, 1));
    assert_eq!(
        of(&l, Kind::Brk, 3),
        (0x8000, 1),
        "shrink trims the newest growth first"
    );
}

#[test]
fn fork_copies_outstanding_as_inherited_and_child_frees_match() {
    let mut l = ledger(vec![
        alloc(AllocFn::Malloc, 0x10, 100, 1),
        alloc(AllocFn::Malloc, 0x20, 200, 1),
    ]);
    l.apply(Input::Event(Decoded {
        aux: 200,
        size: 0x11,
        ..ev(EventKind::Fork, AllocFn::Malloc)
    }));
    l.apply(Input::Event(Decoded {
        tgid: 200,
        old_addr: 0x10,
        ..ev(EventKind::Free, AllocFn::Free)
    }));
    l.apply(Input::Event(Decoded {
        tgid: 200,
        addr: 0x30,
        size: 7,
        stack: Some(StackId(2)),
        ..ev(EventKind::Alloc, AllocFn::Malloc)
    }));
    let child: Vec<_> = l.groups().into_iter().filter(|g| g.pid == 200).collect();
    let inherited: u64 = child.iter().filter(|g| g.inherited).map(|g| g.bytes).sum();
    let own: u64 = child.iter().filter(|g| !g.inherited).map(|g| g.bytes).sum();
    assert_eq!((inherited, own), (200, 7));
    assert_eq!(
        of(&l, Kind::Heap, 1).0,
        300 + 200,
        "parent keeps both blocks, child one"
    );
    assert_eq!(l.procs[&200].mismatches.unmatched_frees, 0);
}

#[test]
fn exec_starts_a_fresh_image() {
    let mut l = ledger(vec![alloc(AllocFn::Malloc, 0x10, 100, 1)]);
    l.apply(Input::Event(Decoded {
        command: Some("new".into()),
        ..ev(EventKind::Exec, AllocFn::Malloc)
    }));
    assert_eq!(of(&l, Kind::Heap, 1), (0, 0));
    assert_eq!(l.procs[&PID].command, "new");
    assert_eq!(l.procs[&PID].execs, 1);
}
