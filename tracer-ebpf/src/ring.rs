//! The kernel side's output, at the bottom of the crate: the event ring, the loss and activity
//! counters, and the bare event header every record starts from.

use aya_ebpf::{
    Global,
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    macros::map,
    maps::{PerCpuArray, RingBuf},
};
use tracer_common::{COUNTERS, Counter, Event, RINGBUF_BYTES};

#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(RINGBUF_BYTES, 0);

/// Loss and activity counters, indexed by [`Counter`].
#[map]
pub static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTERS, 0);

#[inline(always)]
pub fn count(c: Counter) {
    if let Some(p) = STATS.get_ptr_mut(c as u32) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU while the program runs.
        unsafe { *p += 1 };
    }
}

/// An event header without a timestamp (frees: nothing reads their time; the clock costs).
#[inline(always)]
pub fn untimed_event(kind: tracer_common::EventKind, func: u32, id: u64) -> Event {
    let mut ev = Event {
        kind: kind as u32,
        func,
        tgid: (id >> 32) as u32,
        tid: id as u32,
        ..Event::default()
    };
    // A zero LLVM cannot see: it otherwise turns the last two fields' zeroing into a call of a
    // byte-wise `memset` subprogram, ~20 ns of an allocation's return program here.
    let zero = crate::unwind::opaque(0);
    (ev.old_size, ev.aux) = (zero, zero);
    ev
}

/// Bytes waiting in the ring from which a data record wakes the consumer: a quarter of the ring,
/// set by user space at load (the ring's size is chosen then).
#[unsafe(no_mangle)]
static WAKE_AT_BYTES: Global<u64> = Global::new(RINGBUF_BYTES as u64 / 4);

/// How a data record is sent: without waking the consumer while the ring holds less than
/// [`WAKE_AT_BYTES`] (it looks at the ring on a clock and drains everything); waking it past
/// that, so that a burst faster than its clock expects is drained as it comes. A wakeup is an
/// inter-processor interrupt, and one per record costs more than the record. A full ring is
/// counted as `ringbuf_full`, never silent.
#[inline(always)]
pub fn data_flags() -> u64 {
    if EVENTS.query(BPF_RB_AVAIL_DATA as u64) >= WAKE_AT_BYTES.load() {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}
