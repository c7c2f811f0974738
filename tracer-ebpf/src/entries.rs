//! Each traced thread's entry ([`Pending`]): its allocator call in flight, its unsent frees, its
//! last stack. The entry's home is the thread's task storage; while the thread runs, the entry is
//! resident in its CPU's slot, and the allocator probes reach it there by comparing the address
//! of the thread's saved user registers, their context (a task-storage lookup costs ~19 ns here,
//! three a malloc+free pair; even the thread-id helper's call and return cost ~8 ns).
//!
//! The slot is a cache with one writer at a time:
//! - a thread's first heap call after it was switched in brings its entry in, when the slot is
//!   empty (the entry is copied from its home);
//! - `switch_out` writes the entry back home and empties the slot. A thread preempted inside the
//!   kernel (`preempt`: it may be in the middle of one of these programs, which run with migration
//!   disabled and hold the slot's address) keeps the slot: it comes back to this CPU to finish,
//!   and its next switch-out writes back again. Its home is marked with this CPU, so that the
//!   thread, if it resumes elsewhere after all, empties this slot before it uses its entry there,
//!   or at its next switch-out;
//! - a thread that finds the slot kept by another uses its home directly, as every thread did
//!   before the slot.

use aya_ebpf::{
    bindings::pt_regs,
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

/// Per CPU: the thread whose entry is resident, by two names: `key`, the address of its saved
/// user registers (what a uprobe program's context points to: the top of the thread's kernel
/// stack, one address per live thread, so the allocator probes name the thread without a helper
/// call), and `id`, its `bpf_get_current_pid_tgid()`; 0: none (the idle task makes no heap calls).
#[repr(C)]
pub struct Slot {
    key: u64,
    id: u64,
    entry: Pending,
}

#[map]
static SLOT: PerCpuArray<Slot> = PerCpuArray::with_max_entries(1, 0);

/// This CPU's slot.
#[inline(always)]
fn slot() -> Option<&'static mut Slot> {
    // SAFETY: this CPU's slot, written only by programs of the thread it names (see above).
    SLOT.get_ptr_mut(0).map(|s| unsafe { &mut *s })
}

/// The entry of the thread a uprobe program runs in (`regs`: the program's context), with the
/// thread's `bpf_get_current_pid_tgid()`, if it has one.
#[inline(always)]
pub fn of_probe(regs: *const pt_regs) -> Option<(&'static mut Pending, u64)> {
    of_probe_entry(regs, false)
}

/// As [`of_probe`], the entry created (zeroed) if the thread has none; None when memory is short.
#[inline(always)]
pub fn of_probe_or_create(regs: *const pt_regs) -> Option<(&'static mut Pending, u64)> {
    of_probe_entry(regs, true)
}

#[inline(always)]
fn of_probe_entry(regs: *const pt_regs, create: bool) -> Option<(&'static mut Pending, u64)> {
    let key = regs as u64;
    let slot = slot()?;
    if slot.key == key {
        let id = slot.id;
        return Some((&mut slot.entry, id));
    }
    let id = bpf_get_current_pid_tgid();
    let home = if create {
        HOME.current_or_create()?
    } else {
        HOME.current()?
    };
    Some((bring_in(slot, home, key, id), id))
}

/// The calling thread's entry, if it has one, for programs other than uprobes (found by thread
/// id; not brought into the slot when it is elsewhere).
#[inline(always)]
pub fn current() -> Option<&'static mut Pending> {
    let id = bpf_get_current_pid_tgid();
    let slot = slot()?;
    if slot.id == id {
        return Some(&mut slot.entry);
    }
    let home = HOME.current()?;
    settle(home, id);
    Some(home)
}

/// Empties the slot of another CPU that may still hold a copy of `home`'s entry, kept there when
/// its thread (`id`) was preempted (its home has had that copy since). First, whatever happens
/// next: the entry is about to change at home or in this CPU's slot.
#[inline(always)]
fn settle(home: &mut Pending, id: u64) {
    if home.kept_on == 0 {
        return;
    }
    // SAFETY: helper without memory arguments.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    if home.kept_on != u64::from(cpu) + 1 {
        evict_elsewhere(home.kept_on - 1, id);
    }
    home.kept_on = 0;
}

/// Makes `home`'s entry resident in `slot` when the slot is free, and returns where the entry is
/// to be used.
#[inline(always)]
fn bring_in(
    slot: &'static mut Slot,
    home: &'static mut Pending,
    key: u64,
    id: u64,
) -> &'static mut Pending {
    settle(home, id);
    if slot.key != 0 {
        return home; // kept by a thread preempted on this CPU
    }
    if copy(&mut slot.entry, home) {
        (slot.key, slot.id) = (key, id);
        return &mut slot.entry;
    }
    home
}

/// Empties CPU `cpu`'s slot if it still holds thread `id`'s entry.
#[inline(always)]
fn evict_elsewhere(cpu: u64, id: u64) {
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
            && other.id == id
        {
            (other.key, other.id) = (0, 0);
        }
    }
}

/// sched_switch, in the thread switched out (still the current one): its unsent frees are sent
/// and its resident entry goes home. `preempt`: it was preempted inside the kernel, perhaps in one
/// of these programs, and keeps the slot (see the module's notes).
#[inline(always)]
pub fn switch_out(preempt: bool) {
    let id = bpf_get_current_pid_tgid();
    let Some(slot) = slot() else {
        return;
    };
    let Some(home) = HOME.current() else {
        return; // not a traced thread
    };
    // A copy kept elsewhere goes now, at the latest when the thread dies: a slot must not outlive
    // its thread (a new thread may be given the same kernel stack, and so the same key).
    settle(home, id);
    if slot.id != id {
        flush_frees(home);
        return;
    }
    flush_frees(&mut slot.entry);
    if copy(home, &slot.entry) {
        if preempt {
            // SAFETY: helper without memory arguments.
            home.kept_on = u64::from(unsafe { bpf_get_smp_processor_id() }) + 1;
        } else {
            (slot.key, slot.id) = (0, 0);
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
