//! Ledger semantics on synthetic event sequences.

use std::sync::Arc;

use tracer_common::AllocFn;

use super::*;
use crate::{
    ingest::{Event, Input, What},
    model::Frame,
};

mod layers;

const PID: u32 = 100;
const RW: u64 = 3;

/// An event of `func` in the fixture's process, from stack 1.
fn ev(func: AllocFn, what: What) -> Event {
    Event {
        tgid: PID,
        tid: 0,
        ts_ns: 1,
        func: Some(func),
        stack: Some(StackId::new(1)),
        what,
    }
}

fn alloc(func: AllocFn, addr: u64, size: u64, stack: u32) -> Input {
    Input::Event(Event {
        stack: Some(StackId::new(stack)),
        ..ev(func, What::Alloc { addr, size })
    })
}
fn free(addr: u64) -> Input {
    Input::Event(Event {
        stack: None,
        ..ev(AllocFn::Free, What::Free { addr })
    })
}
fn realloc(old: u64, new: u64, size: u64, stack: u32) -> Input {
    Input::Event(Event {
        stack: Some(StackId::new(stack)),
        ..ev(
            AllocFn::Realloc,
            What::Realloc {
                old,
                addr: new,
                size,
            },
        )
    })
}
/// An anonymous private mapping with protection `prot`.
fn mmap(addr: u64, len: u64, prot: u64, stack: u32) -> Input {
    mmap_by(addr, len, prot, stack, false)
}

/// As [`mmap`]; `by_allocator`: made inside an allocator call.
fn mmap_by(addr: u64, len: u64, prot: u64, stack: u32, by_allocator: bool) -> Input {
    let what = What::Mmap {
        addr,
        len,
        anonymous: true,
        no_access: prot == 0,
        by_allocator,
    };
    Input::Event(Event {
        stack: Some(StackId::new(stack)),
        ..ev(AllocFn::Mmap, what)
    })
}
fn munmap(addr: u64, len: u64) -> Input {
    Input::Event(ev(AllocFn::Munmap, What::Munmap { addr, len }))
}
fn mprotect(addr: u64, len: u64, prot: u64) -> Input {
    let what = What::Mprotect {
        addr,
        len,
        no_access: prot == 0,
    };
    Input::Event(ev(AllocFn::Mprotect, what))
}
fn brk(result: u64, stack: u32) -> Input {
    Input::Event(Event {
        stack: Some(StackId::new(stack)),
        ..ev(AllocFn::Brk, What::Brk { result })
    })
}
/// A fork of the fixture's process into `child` (`shares_vm`: CLONE_VM).
fn fork(child: u32, shares_vm: bool) -> Input {
    let what = What::Fork {
        child,
        shares_vm,
        command: None,
    };
    Input::Event(ev(AllocFn::Malloc, what))
}

fn ledger(inputs: Vec<Input>) -> Ledger {
    let mut l = Ledger::default();
    l.add_root(PID, "fixture".into(), Vec::new(), 0);
    for s in 1..=9 {
        let frames: Arc<[Frame]> = Arc::from(vec![Frame {
            module: None,
            offset: s,
            addr: s,
        }]);
        l.apply(Input::Stack {
            id: StackId::new(s as u32),
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
        .filter(|g| g.kind == kind && g.stack == Some(StackId::new(stack)))
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

/// `input` (an event) as thread `tid`'s.
fn by(tid: u32, input: Input) -> Input {
    match input {
        Input::Event(e) => Input::Event(Event { tid, ..e }),
        other => other,
    }
}

fn thread_exit(tid: u32) -> Input {
    Input::Event(Event {
        tid,
        stack: None,
        ..ev(AllocFn::Free, What::ThreadExit)
    })
}

#[test]
fn frees_a_thread_makes_after_its_last_allocation_before_it_exits_are_the_allocators() {
    // Thread 7 frees its block, then, exiting, glibc frees its cache (0x900, never seen made)
    // and a block already freed (0x100). Thread 8 frees an unknown address, then allocates, then
    // exits: that free is unmatched. Thread 9 frees an unknown address and lives on.
    let l = ledger(vec![
        by(7, alloc(AllocFn::Malloc, 0x100, 16, 1)),
        by(7, free(0x100)),
        by(7, free(0x900)),
        by(7, free(0x100)),
        by(7, thread_exit(7)),
        by(8, free(0xa00)),
        by(8, alloc(AllocFn::Malloc, 0x200, 16, 1)),
        by(8, thread_exit(8)),
        by(9, free(0xb00)),
    ]);
    let m = l.procs[&PID].mismatches;
    assert_eq!((m.unmatched_frees, m.thread_exit_frees), (2, 2));
    assert_eq!(of(&l, Kind::Heap, 1), (16, 1));
}

/// In a process whose malloc family went in late, an address handed out again before its free
/// was seen is a free missed while the probes went in (malloc's live before free's): untraced,
/// not a mismatch; a free that arrives after still releases the replaced block.
#[test]
fn a_reused_address_in_a_late_layer_is_an_untraced_free() {
    let mut l = ledger(vec![]);
    l.procs.get_mut(&PID).unwrap().layer_late = true;
    l.apply(alloc(AllocFn::Malloc, 0x10, 100, 1));
    l.apply(alloc(AllocFn::Malloc, 0x10, 40, 2));
    let m = l.procs[&PID].mismatches;
    assert_eq!((m.reused_addresses, m.untraced_frees), (0, 1));
    l.apply(free(0x10));
    let m = l.procs[&PID].mismatches;
    assert_eq!((m.reused_addresses, m.untraced_frees), (0, 0));
    assert_eq!(of(&l, Kind::Heap, 2), (40, 1));
}

/// A thread's frees arrive with its next record: another thread may be handed the freed address
/// first. The late free is the replaced block's; the new block stays.
#[test]
fn a_late_free_releases_the_replaced_block_not_the_new_one() {
    let events = |n: usize| {
        let mut v = vec![
            alloc(AllocFn::Malloc, 0x10, 100, 1), // thread 1
            alloc(AllocFn::Malloc, 0x10, 40, 2),  // thread 2, before thread 1's free arrived
        ];
        v.extend((0..n).map(|_| free(0x10))); // thread 1's free, then thread 2's
        ledger(v)
    };
    let l = events(0);
    assert_eq!(
        l.procs[&PID].mismatches.reused_addresses, 1,
        "free not yet seen"
    );
    let l = events(1);
    assert_eq!(of(&l, Kind::Heap, 1), (0, 0));
    assert_eq!(of(&l, Kind::Heap, 2), (40, 1));
    assert_eq!(l.procs[&PID].mismatches.reused_addresses, 0);
    assert_eq!(l.procs[&PID].mismatches.unmatched_frees, 0);
    let l = events(2);
    assert_eq!(of(&l, Kind::Heap, 2), (0, 0));
    assert_eq!(l.procs[&PID].mismatches.unmatched_frees, 0);
    // realloc's old block is the caller's: the outstanding one, whatever free is to come.
    let l = ledger(vec![
        alloc(AllocFn::Malloc, 0x10, 100, 1),
        alloc(AllocFn::Malloc, 0x10, 40, 2),
        realloc(0x10, 0x80, 60, 3),
        free(0x10),
    ]);
    assert_eq!(of(&l, Kind::Heap, 2), (0, 0));
    assert_eq!(of(&l, Kind::Heap, 3), (60, 1));
    assert_eq!(l.procs[&PID].mismatches.reused_addresses, 0);
    assert_eq!(l.procs[&PID].mismatches.unmatched_frees, 0);
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

/// A file's mapping (a library, read-only data) is not memory the ledger counts, and unmapping it
/// is no mismatch; unmapping what was never mapped is, and so is a file mapped over by anonymous
/// memory, then unmapped twice.
#[test]
fn unmapping_a_file_is_no_mismatch() {
    let base = 0x7f00_0000_0000u64;
    let file = |addr, len| {
        let what = What::Mmap {
            addr,
            len,
            anonymous: false,
            no_access: false,
            by_allocator: false,
        };
        Input::Event(ev(AllocFn::Mmap, what))
    };
    let l = ledger(vec![
        file(base, 5 << 12),
        munmap(base + (1 << 12), 2 << 12),
        munmap(base, 5 << 12),
        munmap(base + (64 << 12), 1 << 12),
    ]);
    assert_eq!(of(&l, Kind::Mmap, 1), (0, 0));
    // The file's five pages are matched once each: the two unmapped first count again when the
    // whole file is, and one page was never mapped.
    assert_eq!(l.procs[&PID].mismatches.unmatched_unmap_bytes, 3 << 12);
    let l = ledger(vec![
        file(base, 4 << 12),
        mmap(base, 4 << 12, RW, 1),
        munmap(base, 4 << 12),
        munmap(base, 4 << 12),
    ]);
    assert_eq!(l.procs[&PID].mismatches.unmatched_unmap_bytes, 4 << 12);
}

/// The same reservation made by malloc (a thread's first allocation makes its arena): what
/// mprotect opens is the allocator's heap, counted as its brk heap is, at the allocating stack;
/// a large block malloc maps with access stays a mapping.
#[test]
fn an_arena_malloc_reserves_is_the_allocators_heap() {
    let base = 0x7f00_0000_0000u64;
    let l = ledger(vec![
        mmap_by(base, 128 << 20, 0, 1, true),
        munmap(base, 12 << 20),
        munmap(base + (76 << 20), 52 << 20),
        mprotect(base + (12 << 20), 135168, RW),
        mprotect(base + (12 << 20) + 135168, 65536, RW),
        mmap_by(0x10_0000, 1 << 20, RW, 2, true),
    ]);
    assert_eq!(of(&l, Kind::Brk, 1), (135168 + 65536, 2));
    assert_eq!(of(&l, Kind::Mmap, 1), (0, 0));
    assert_eq!(of(&l, Kind::Mmap, 2), (1 << 20, 1));
}

#[test]
fn partial_munmap_and_mremap() {
    let l = ledger(vec![
        mmap(0x10000, 10 * 4096, RW, 1),
        munmap(0x10000 + 4 * 4096, 2 * 4096),
        mmap(0x100000, 4 * 4096, RW, 2),
        Input::Event(Event {
            stack: Some(StackId::new(3)),
            ..ev(
                AllocFn::Mremap,
                What::Mremap {
                    old: 0x100000,
                    old_len: 4 * 4096,
                    addr: 0x200000,
                    len: 16 * 4096,
                },
            )
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
    // Flags 0x11: SIGCHLD, no CLONE_VM.
    l.apply(fork(200, false));
    l.apply(Input::Event(Event {
        tgid: 200,
        tid: 0,
        ..ev(AllocFn::Free, What::Free { addr: 0x10 })
    }));
    l.apply(Input::Event(Event {
        tgid: 200,
        tid: 0,
        stack: Some(StackId::new(2)),
        ..ev(
            AllocFn::Malloc,
            What::Alloc {
                addr: 0x30,
                size: 7,
            },
        )
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
    let what = What::Exec {
        command: Some("new".into()),
        env: None,
    };
    l.apply(Input::Event(ev(AllocFn::Malloc, what)));
    assert_eq!(of(&l, Kind::Heap, 1), (0, 0));
    assert_eq!(l.procs[&PID].command, "new");
    assert_eq!(l.procs[&PID].execs, 1);
}

fn cuda_free(func: AllocFn, addr: u64) -> Input {
    Input::Event(Event {
        stack: None,
        ..ev(func, What::Free { addr })
    })
}

fn outstanding(l: &Ledger, kind: Kind) -> (u64, u64) {
    l.groups()
        .iter()
        .filter(|g| g.kind == kind)
        .fold((0, 0), |(b, n), g| (b + g.bytes, n + g.blocks))
}

#[test]
fn device_memory_is_kept_apart_from_the_heap() {
    let mut l = ledger(Vec::new());
    // The same address as a heap block: device pointers live in their own table.
    l.apply(alloc(AllocFn::Malloc, 0x1000, 10, 1));
    l.apply(alloc(AllocFn::CudaMalloc, 0x1000, 1 << 20, 2));
    l.apply(alloc(AllocFn::CudaMallocManaged, 0x2000, 300, 2));
    l.apply(alloc(AllocFn::CudaHostAlloc, 0x3000, 400, 2));
    l.apply(alloc(AllocFn::CuMemCreate, 7, 2 << 20, 3));
    assert_eq!(outstanding(&l, Kind::Heap), (10, 1));
    assert_eq!(outstanding(&l, Kind::Device), ((1 << 20) + (2 << 20), 2));
    assert_eq!(outstanding(&l, Kind::Managed), (300, 1));
    assert_eq!(outstanding(&l, Kind::Pinned), (400, 1));
    // cudaFree frees the device block, not the heap block at the same address; a handle is
    // released by cuMemRelease only.
    l.apply(cuda_free(AllocFn::CudaFree, 0x1000));
    l.apply(cuda_free(AllocFn::CudaFree, 7));
    assert_eq!(outstanding(&l, Kind::Heap), (10, 1));
    assert_eq!(outstanding(&l, Kind::Device), (2 << 20, 1));
    l.apply(cuda_free(AllocFn::CuMemRelease, 7));
    assert_eq!(outstanding(&l, Kind::Device), (0, 0));
    assert_eq!(
        l.procs[&PID].device.unmatched_frees, 1,
        "cudaFree(7) matched nothing"
    );
}

#[test]
fn device_memory_is_not_inherited_and_ends_with_exec() {
    let mut l = ledger(Vec::new());
    l.apply(alloc(AllocFn::CudaMalloc, 0x1000, 100, 2));
    l.apply(fork(200, false));
    assert!(
        l.procs[&200].device.blocks.is_empty(),
        "a CUDA context does not survive fork"
    );
    assert_eq!(l.procs[&PID].device.blocks.len(), 1);
    let what = What::Exec {
        command: None,
        env: None,
    };
    l.apply(Input::Event(ev(AllocFn::Malloc, what)));
    assert!(l.procs[&PID].device.blocks.is_empty());
}

#[test]
fn failures_are_counted_per_stack_function_and_code() {
    let mut l = ledger(Vec::new());
    let failed = |size: u64, code: u32, stack: u32| {
        Input::Event(Event {
            stack: Some(StackId::new(stack)),
            ..ev(AllocFn::CudaMalloc, What::AllocFailed { code, size })
        })
    };
    l.apply(failed(1 << 30, 2, 1));
    l.apply(failed(1 << 30, 2, 1));
    l.apply(failed(8, 1, 1));
    let f = &l.procs[&PID].device.failures;
    assert_eq!(f.len(), 2);
    assert_eq!((f[0].calls, f[0].bytes, f[0].code), (2, 2 << 30, 2));
    assert_eq!(
        outstanding(&l, Kind::Device),
        (0, 0),
        "a failure allocates nothing"
    );
}

#[test]
fn tensors_are_heap_blocks_of_their_own_kind() {
    let mut l = ledger(Vec::new());
    l.apply(alloc(AllocFn::C10AllocCpu, 0x5000, 4096, 4));
    assert_eq!(outstanding(&l, Kind::Tensor), (4096, 1));
    assert_eq!(outstanding(&l, Kind::Heap), (0, 0));
    l.apply(free(0x5000)); // c10::free_cpu frees with free()
    assert_eq!(outstanding(&l, Kind::Tensor), (0, 0));
}

#[test]
fn a_tensor_recorded_first_by_its_posix_memalign_is_one_tensor() {
    let mut l = ledger(Vec::new());
    l.apply(alloc(AllocFn::PosixMemalign, 0x5000, 4096, 3));
    l.apply(alloc(AllocFn::C10AllocCpu, 0x5000, 4096, 4));
    assert_eq!(outstanding(&l, Kind::Tensor), (4096, 1));
    assert_eq!(outstanding(&l, Kind::Heap), (0, 0));
    assert_eq!(l.procs[&PID].mismatches.reused_addresses, 0);
    l.apply(free(0x5000));
    assert_eq!(outstanding(&l, Kind::Tensor), (0, 0));
    assert_eq!(l.procs[&PID].mismatches.unmatched_frees, 0);
    // Another size at that address is a block whose free was not seen.
    l.apply(alloc(AllocFn::PosixMemalign, 0x6000, 4096, 3));
    l.apply(alloc(AllocFn::C10AllocCpu, 0x6000, 8192, 4));
    assert_eq!(l.procs[&PID].mismatches.reused_addresses, 1);
}

/// `--heap sampled`: the posix_memalign block recorded first counts for what it stands for
/// (64 KiB at a 512 KiB interval: 557,738 bytes); the tensor at its address is still that block,
/// and its free leaves nothing.
#[test]
fn a_tensor_whose_posix_memalign_was_sampled_is_one_tensor() {
    let mean = 512 << 10;
    let mut l = Ledger {
        heap_sampling: mean,
        ..Ledger::default()
    };
    let scaled = crate::ingest::unsampled(64 << 10, mean);
    l.apply(alloc(AllocFn::PosixMemalign, 0x5000, scaled, 3));
    l.apply(alloc(AllocFn::C10AllocCpu, 0x5000, 64 << 10, 4));
    assert_eq!(outstanding(&l, Kind::Tensor), (64 << 10, 1));
    assert_eq!(outstanding(&l, Kind::Heap), (0, 0));
    assert_eq!(l.procs[&PID].mismatches.reused_addresses, 0);
    l.apply(free(0x5000));
    assert_eq!(outstanding(&l, Kind::Tensor), (0, 0));
    // The same block without sampling is one whose free was not seen.
    l.heap_sampling = 0;
    l.apply(alloc(AllocFn::PosixMemalign, 0x6000, scaled, 3));
    l.apply(alloc(AllocFn::C10AllocCpu, 0x6000, 64 << 10, 4));
    assert_eq!(l.procs[&PID].mismatches.reused_addresses, 1);
}

#[test]
fn pages_grown_for_a_tensor_take_its_stack() {
    let stack_of = |l: &Ledger, kind: Kind| -> Vec<Option<StackId>> {
        let groups = l.groups();
        groups
            .iter()
            .filter(|g| g.kind == kind)
            .map(|g| g.stack)
            .collect()
    };
    let mut l = ledger(Vec::new());
    l.apply(brk(0x10_0000, 1)); // the heap's base
    // The heap grows inside the tensor's posix_memalign, with the syscall's stack (2).
    l.apply(brk(0x14_0000, 2));
    l.apply(alloc(AllocFn::C10AllocCpu, 0x10_0010, 0x3_0000, 4));
    assert_eq!(stack_of(&l, Kind::Brk), vec![Some(StackId::new(4))]);
    // A large tensor's own mapping, then one that is not in the mapping made before it.
    l.apply(mmap_by(0x7000_0000, 0x10_0000, 3, 2, false));
    l.apply(alloc(AllocFn::C10AllocCpu, 0x7000_0010, 0xf_0000, 5));
    l.apply(mmap_by(0x7100_0000, 0x10_0000, 3, 2, false));
    l.apply(alloc(AllocFn::C10AllocCpu, 0x10_2000, 64, 6));
    let mut mmaps = stack_of(&l, Kind::Mmap);
    mmaps.sort();
    assert_eq!(mmaps, vec![Some(StackId::new(2)), Some(StackId::new(5))]);
}

#[test]
fn mappings_of_handles_are_tracked() {
    let mut l = ledger(Vec::new());
    let what = What::DeviceMap {
        addr: 0x2000_0000_0000,
        size: 2 << 20,
        handle: 7,
    };
    l.apply(Input::Event(ev(AllocFn::CuMemMap, what)));
    assert_eq!(l.procs[&PID].device.mapped_bytes(), 2 << 20);
    let what = What::DeviceUnmap {
        addr: 0x2000_0000_0000,
    };
    l.apply(Input::Event(ev(AllocFn::CuMemUnmap, what)));
    assert_eq!(l.procs[&PID].device.mapped_bytes(), 0);
}

#[test]
fn torch_blocks_sit_beside_the_segments_they_are_cut_from() {
    let mut l = ledger(Vec::new());
    // A 2 MiB segment from cudaMalloc; the caching allocator's first block shares its address.
    l.apply(alloc(AllocFn::CudaMalloc, 0x7000_0000, 2 << 20, 1));
    l.apply(alloc(AllocFn::TorchCudaMalloc, 0x7000_0000, 512, 2));
    l.apply(alloc(AllocFn::TorchCudaMalloc, 0x7000_0200, 1024, 2));
    assert_eq!(outstanding(&l, Kind::Device), (2 << 20, 1), "reserved");
    assert_eq!(outstanding(&l, Kind::TorchBlock), (1536, 2), "allocated");
    // A tensor freed back to the cache: the segment stays reserved.
    l.apply(cuda_free(AllocFn::TorchCudaFree, 0x7000_0000));
    assert_eq!(outstanding(&l, Kind::TorchBlock), (1024, 1));
    assert_eq!(outstanding(&l, Kind::Device), (2 << 20, 1));
    // emptyCache: cudaFree of the segment leaves the block table alone.
    l.apply(cuda_free(AllocFn::CudaFree, 0x7000_0000));
    assert_eq!(outstanding(&l, Kind::Device), (0, 0));
    assert_eq!(outstanding(&l, Kind::TorchBlock), (1024, 1));
}

/// An accumulator grown by copying (`acc = torch.cat([acc, x])`: the new tensor made, the old
/// one freed) is caught by a sample holding both; the least it held since the sample before
/// is one copy. Only heap-level kinds are told so.
#[test]
fn the_least_held_since_the_last_sample_is_one_copy_of_an_accumulator() {
    let mut l = ledger(vec![alloc(AllocFn::C10AllocCpu, 0x1_0000, 1000, 4)]);
    l.sampled();
    l.apply(alloc(AllocFn::C10AllocCpu, 0x2_0000, 1100, 4));
    l.apply(free(0x1_0000));
    l.apply(alloc(AllocFn::C10AllocCpu, 0x3_0000, 1200, 4));
    let key = |kind| GroupKey {
        pid: PID,
        stack: Some(StackId::new(4)),
        kind,
        inherited: false,
    };
    assert_eq!(outstanding(&l, Kind::Tensor), (2300, 2));
    assert_eq!(l.least_since_sample(&key(Kind::Tensor), 2300), 1100);
    assert_eq!(l.least_since_sample(&key(Kind::Mmap), 2300), 2300);
    l.sampled();
    assert_eq!(l.least_since_sample(&key(Kind::Tensor), 2300), 2300);
}

/// The brk heap's top trimmed and grown again between two samples by the same stack (a step's
/// scratch buffers above the others, given back and asked for again): the least its pages held
/// since the sample before is what was left under the trim, not the instant a sample catches.
#[test]
fn the_least_a_heap_tops_pages_held_since_the_last_sample_is_under_its_trims() {
    let mut l = ledger(vec![brk(0x5000_0000, 1), brk(0x5002_0000, 2)]);
    l.sampled();
    l.apply(brk(0x5001_0000, 9));
    l.apply(brk(0x5002_0000, 2));
    l.apply(brk(0x5003_0000, 3));
    let key = |stack| GroupKey {
        pid: PID,
        stack: Some(StackId::new(stack)),
        kind: Kind::Brk,
        inherited: false,
    };
    assert_eq!(of(&l, Kind::Brk, 2), (0x20000, 2));
    assert_eq!(l.least_since_sample(&key(2), 0x20000), 0x10000);
    assert_eq!(
        l.least_since_sample(&key(3), 0x10000),
        0x10000,
        "grown only since"
    );
    l.sampled();
    assert_eq!(l.least_since_sample(&key(2), 0x20000), 0x20000);
    // Trimmed through two stacks' pages: each held less.
    l.apply(brk(0x5000_8000, 9));
    l.apply(brk(0x5003_0000, 4));
    assert_eq!(l.least_since_sample(&key(2), 0x8000), 0x8000);
    assert_eq!(of(&l, Kind::Brk, 3), (0, 0));
    // Pages a tensor's allocation grew are its stack's from the start: no dip of the brk
    // call's stack below what it held before them.
    l.sampled();
    l.apply(brk(0x5004_0000, 4));
    l.apply(alloc(AllocFn::C10AllocCpu, 0x5003_0010, 0x8000, 5));
    assert_eq!(of(&l, Kind::Brk, 4), (0x28000, 1));
    assert_eq!(of(&l, Kind::Brk, 5), (0x10000, 1));
    assert_eq!(l.least_since_sample(&key(4), 0x28000), 0x28000);
    assert_eq!(l.least_since_sample(&key(5), 0x10000), 0x10000);
}
