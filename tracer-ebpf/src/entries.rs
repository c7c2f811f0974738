//! Each traced thread's entry ([`Pending`]): its allocator call in flight, its unsent frees, its
//! last stack. The entry's home is the thread's task storage; while the thread runs, the entry is
//! resident in its CPU's slot, and the allocator probes reach it there by comparing a thread id
//! (a task-storage lookup costs ~19 ns here, three a malloc+free pair).
//!
//! The slot is a cache with one writer at a time:
//! - a thread's first heap call after it was switched in brings its entry in, when the slot is
//!   empty (the entry is copied from its home);
//! - `switch_out` writes the entry back home and empties the slot. A thread preempted inside the
//!   kernel (`preempt`: it may be in the middle of one of these programs, which run with migration
//!   disabled and hold the slot's address) keeps the slot: it comes back to this CPU to finish,
//!   and its next switch-out writes back again. Its home is marked with this CPU, so that the
//!   thread, if it resumes elsewhere after all, empties this slot before it brings its entry into
//!   another;
//! - a thread that finds the slot kept by another uses its home directly, as every thread did
//!   before the slot.

use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid,
        generated::{bpf_get_smp_processor_id, bpf_map_lookup_percpu_elem, bpf_probe_read_kernel},
    },
    macros::{btf_map, map},
    maps::PerCpuArray,
};
use tracer_common::Pending;

use crate::{shared::flush_frees, task_storage::TaskStorage};

/// Each thread's entry at home (idle between calls: depth 0). A thread has one only once its
/// process is traced, and it goes away with the thread.
#[btf_map]
static HOME: TaskStorage<Pending> = TaskStorage::new();

/// Per CPU: the thread whose entry is resident (0: none; the idle task makes no heap calls).
#[repr(C)]
pub struct Slot {
    tid: u64,
    entry: Pending,
}

#[map]
static SLOT: PerCpuArray<Slot> = PerCpuArray::with_max_entries(1, 0);

/// The calling thread's entry, if it has one.
#[inline(always)]
pub fn current() -> Option<&'static mut Pending> {
    current_of(bpf_get_current_pid_tgid())
}

/// As [`current`], for the calling thread's `bpf_get_current_pid_tgid()` already read.
#[inline(always)]
pub fn current_of(id: u64) -> Option<&'static mut Pending> {
    entry(id, false)
}

/// The calling thread's entry (`id`: its `bpf_get_current_pid_tgid()`), created (zeroed) if it
/// has none; None when memory is short.
#[inline(always)]
pub fn current_or_create(id: u64) -> Option<&'static mut Pending> {
    entry(id, true)
}

#[inline(always)]
fn entry(id: u64, create: bool) -> Option<&'static mut Pending> {
    let tid = id as u32 as u64;
    // SAFETY: this CPU's slot, written only by programs of the thread it names (see above).
    let slot = unsafe { &mut *SLOT.get_ptr_mut(0)? };
    if slot.tid == tid {
        return Some(&mut slot.entry);
    }
    let home = if create {
        HOME.current_or_create()?
    } else {
        HOME.current()?
    };
    Some(bring_in(slot, home, tid))
}

/// Makes `home`'s entry resident in `slot` when the slot is free, and returns where the entry is
/// to be used.
#[inline(always)]
fn bring_in(slot: &'static mut Slot, home: &'static mut Pending, tid: u64) -> &'static mut Pending {
    // First, whatever happens here: the entry is about to change at home or in this slot.
    if home.kept_on != 0 {
        // SAFETY: helper without memory arguments.
        let cpu = unsafe { bpf_get_smp_processor_id() };
        if home.kept_on != u64::from(cpu) + 1 {
            evict_elsewhere(home.kept_on - 1, tid);
        }
        home.kept_on = 0;
    }
    if slot.tid != 0 {
        return home; // kept by a thread preempted on this CPU
    }
    if copy(&mut slot.entry, home) {
        slot.tid = tid;
        return &mut slot.entry;
    }
    home
}

/// Empties CPU `cpu`'s slot if it still holds thread `tid`'s entry, kept there when the thread
/// was preempted (its home has had that copy since).
#[inline(always)]
fn evict_elsewhere(cpu: u64, tid: u64) {
    let key = 0u32;
    // SAFETY: the helper returns that CPU's value or null. That slot is this thread's while it
    // names it: no other program writes it until it is emptied.
    unsafe {
        let other = bpf_map_lookup_percpu_elem(
            core::ptr::from_ref(&SLOT).cast_mut().cast(),
            core::ptr::from_ref(&key).cast(),
            cpu as u32,
        )
        .cast::<Slot>();
        if let Some(other) = other.as_mut()
            && other.tid == tid
        {
            other.tid = 0;
        }
    }
}

/// sched_switch, in the thread switched out (still the current one): its unsent frees are sent
/// and its resident entry goes home. `preempt`: it was preempted inside the kernel, perhaps in one
/// of these programs, and keeps the slot (see the module's notes).
#[inline(always)]
pub fn switch_out(preempt: bool) {
    let tid = bpf_get_current_pid_tgid() as u32 as u64;
    let Some(home) = HOME.current() else {
        return; // not a traced thread
    };
    // SAFETY: as in `current`.
    let Some(slot) = SLOT.get_ptr_mut(0).map(|s| unsafe { &mut *s }) else {
        return;
    };
    if slot.tid != tid {
        flush_frees(home);
        return;
    }
    flush_frees(&mut slot.entry);
    if copy(home, &slot.entry) {
        if preempt {
            // SAFETY: helper without memory arguments.
            home.kept_on = u64::from(unsafe { bpf_get_smp_processor_id() }) + 1;
        } else {
            slot.tid = 0;
        }
    }
}

/// Copies one entry onto another (a helper call: the verifier follows a copy of this size at no
/// cost, and it runs twice per context switch of a traced thread).
#[inline(always)]
fn copy(dst: &mut Pending, src: &Pending) -> bool {
    // SAFETY: both are whole `Pending` values in map memory.
    unsafe {
        bpf_probe_read_kernel(
            core::ptr::from_mut(dst).cast(),
            size_of::<Pending>() as u32,
            core::ptr::from_ref(src).cast(),
        ) == 0
    }
}
