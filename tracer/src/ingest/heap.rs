//! Heap records: an allocation with the frees its thread made before it ([`HeapRecord`]), and
//! frees alone ([`FreesEvent`]). A heap record names by count the outermost frames it shares with
//! its thread's previous heap record; [`ThreadStacks`] keeps each thread's last stack to complete
//! it.

use std::collections::HashMap;

use tracer_common::{
    AllocFn, Event, EventKind, FREES_PER_RECORD, FreesEvent, HeapRecord, LeafWords, MAX_FRAMES,
    SHARE_NS, StackEvent,
};

use super::{Decoder, Input, leaf, u64_words, unwind};

/// Per thread: its process, the time and the stack (innermost frame first) of its last heap
/// record. A thread's stack goes when the thread's process exits, or [`KEPT_NS`] after its last
/// record (the kernel side shares frames only with a record at most [`SHARE_NS`] old): threads
/// that end are not announced, and their stacks must not pile up.
#[derive(Default)]
pub struct ThreadStacks {
    last: HashMap<u32, Last>,
    /// The latest record time seen, and when the next sweep of old stacks is due.
    now_ns: u64,
    sweep_ns: u64,
}

struct Last {
    tgid: u32,
    ts_ns: u64,
    frames: Vec<u64>,
}

/// How long a thread's last stack is kept after its record.
const KEPT_NS: u64 = 2 * SHARE_NS;

impl ThreadStacks {
    /// The whole stack of a record of thread `tid` at `ts_ns` that sent `frames` (innermost
    /// first) and shares its `shared` outermost frames with the thread's previous heap record; it
    /// becomes the thread's last stack. None when the thread has no such previous stack (a record
    /// of it that user space never decoded): the thread's stack is forgotten until a record sends
    /// it whole.
    pub fn complete(
        &mut self,
        tgid: u32,
        tid: u32,
        ts_ns: u64,
        frames: &[u64],
        shared: usize,
    ) -> Option<&[u64]> {
        self.sweep(ts_ns);
        let last = self.last.entry(tid).or_insert_with(|| Last {
            tgid,
            ts_ns,
            frames: Vec::new(),
        });
        (last.tgid, last.ts_ns) = (tgid, ts_ns);
        let kept = &mut last.frames;
        if shared > kept.len() {
            kept.clear();
            return None;
        }
        kept.drain(..kept.len() - shared);
        kept.splice(0..0, frames.iter().copied());
        Some(kept)
    }

    /// Drops the stacks of threads without a record for [`KEPT_NS`], once per [`SHARE_NS`] of
    /// record time.
    fn sweep(&mut self, ts_ns: u64) {
        self.now_ns = self.now_ns.max(ts_ns);
        if self.now_ns < self.sweep_ns {
            return;
        }
        let now = self.now_ns;
        self.last
            .retain(|_, l| l.ts_ns.saturating_add(KEPT_NS) >= now);
        self.sweep_ns = now + SHARE_NS;
    }

    /// A process exited: its threads' stacks go.
    pub fn forget(&mut self, tgid: u32) {
        self.last.retain(|_, l| l.tgid != tgid);
    }

    /// Every thread's stack goes: after a heap record that could not be decoded, the kernel's
    /// idea of a thread's previous stack may not be ours.
    pub fn clear(&mut self) {
        self.last.clear();
    }

    /// Threads whose last stack is kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.last.len()
    }
}

impl Decoder {
    /// A heap allocation ([`HeapRecord`], with [`LeafWords`] when `leaf`): the thread's frees made
    /// before it, then the allocation.
    pub(super) fn decode_heap(&mut self, bytes: &[u8], leaf: bool, out: &mut Vec<Input>) {
        const HEADER: usize = size_of::<HeapRecord>();
        let Some(header) = bytes.first_chunk::<HEADER>() else {
            self.undecodable_heap();
            return;
        };
        // SAFETY: HEADER bytes; HeapRecord is plain data, read unaligned.
        let h: HeapRecord = unsafe { std::ptr::read_unaligned(header.as_ptr().cast()) };
        // With leaf words, they come first (plain data, read unaligned).
        let (leaf, at) = match leaf {
            false => (None, HEADER),
            true => (
                Some(bytes.get(HEADER..HEADER + size_of::<LeafWords>()).map(|b| {
                    // SAFETY: size_of::<LeafWords>() bytes; LeafWords is plain data.
                    unsafe { std::ptr::read_unaligned(b.as_ptr().cast::<LeafWords>()) }
                })),
                HEADER + size_of::<LeafWords>(),
            ),
        };
        let words = u64_words(bytes.get(at..).unwrap_or_default());
        let (n, m) = (usize::from(h.n_frames), usize::from(h.n_frees));
        let kind = match AllocFn::from_u32(u32::from(h.func)) {
            Some(f) if f.is_realloc() => Some(EventKind::Realloc),
            Some(f) if f.is_heap_alloc() || f.is_object() => Some(EventKind::Alloc),
            _ => None,
        };
        let shared = usize::from(h.shared);
        let (Some(kind), true, true, true) = (
            kind,
            n + shared <= MAX_FRAMES,
            words.len() == n + m,
            leaf.is_none_or(|l| l.is_some()),
        ) else {
            self.undecodable_heap();
            return;
        };
        self.push_frees(h.tgid, h.tid, words[n..].iter().copied(), out);
        let ev = Event {
            kind: kind as u32,
            func: u32::from(h.func),
            tgid: h.tgid,
            tid: h.tid,
            ts_ns: h.ts_ns,
            addr: h.addr,
            size: h.size,
            old_addr: h.old_addr,
            ..Event::default()
        };
        let completed = self
            .thread_stacks
            .complete(h.tgid, h.tid, h.ts_ns, &words[..n], shared);
        let Some(walked) = completed else {
            self.undecodable += 1; // its stack: the event itself counts without one
            self.push_event(kind, &ev, None, out);
            return;
        };
        let mut se = StackEvent {
            event: ev,
            stack_bytes: 8 * walked.len() as i64,
            leaf_caller: 0,
            frames: [0; MAX_FRAMES],
        };
        se.frames[..walked.len()].copy_from_slice(walked);
        let spliced = match leaf {
            Some(Some(leaf)) => self.splice_leaf(&mut se, &leaf),
            _ => false,
        };
        let stack = self.intern(&se, out);
        if let (true, Some(id)) = (spliced, stack) {
            self.call_stacks.insert(h.tid, (h.tgid, se.frames[0], id));
        }
        self.push_event(kind, &ev, stack, out);
    }

    /// Puts back into `se` (a heap record's walked stack) the frames its leaf words unwind to,
    /// in place. Whether the unwind joined the walk (the stack is then the call's own, which
    /// the pages it mapped share).
    fn splice_leaf(&mut self, se: &mut StackEvent, leaf: &LeafWords) -> bool {
        let ev = se.event;
        let n = (se.stack_bytes / 8) as usize;
        let Some(maps) = self.maps.get(ev.tgid) else {
            return false;
        };
        let bytes = leaf::bytes(leaf);
        let raw = unwind::RawStack {
            tid: ev.tid,
            ip: se.frames[0],
            sp: leaf.sp,
            bp: leaf.bp,
            bytes: &bytes,
        };
        let mut unwound = std::mem::take(&mut self.scratch);
        unwound.clear();
        self.unwinders
            .unwind(ev.tgid, maps, &raw, leaf::LEAF_FRAMES, &mut unwound);
        let joined = leaf::joined(&se.frames[..n], &unwound);
        if let Some(k) = joined {
            // unwound[..k], then the walk's chain (frames[1..n]), within MAX_FRAMES.
            let chain = (n - 1).min(MAX_FRAMES - k);
            se.frames.copy_within(1..1 + chain, k);
            se.frames[..k].copy_from_slice(&unwound[..k]);
            se.stack_bytes = 8 * (k + chain) as i64;
        }
        self.scratch = unwound;
        joined.is_some()
    }

    /// A heap record that could not be read: counted, and no thread's stack is trusted after it.
    fn undecodable_heap(&mut self) {
        self.undecodable += 1;
        self.thread_stacks.clear();
    }

    /// A thread's frees not carried by an allocation ([`FreesEvent`]).
    pub(super) fn decode_frees(&mut self, bytes: &[u8], out: &mut Vec<Input>) {
        const HEADER: usize = size_of::<FreesEvent>() - 8 * FREES_PER_RECORD;
        let Some(header) = bytes.first_chunk::<HEADER>() else {
            self.undecodable += 1;
            return;
        };
        let word = |i: usize| u32::from_le_bytes(header[i..i + 4].try_into().expect("4 bytes"));
        let (tgid, n, tid) = (word(4), word(8), word(12));
        let addrs = u64_words(&bytes[HEADER..]);
        if addrs.len() != n as usize || addrs.len() > FREES_PER_RECORD {
            self.undecodable += 1;
            return;
        }
        self.push_frees(tgid, tid, addrs, out);
    }

    /// Thread `tid`'s frees, in the order they were made.
    pub(super) fn push_frees(
        &mut self,
        tgid: u32,
        tid: u32,
        addrs: impl IntoIterator<Item = u64>,
        out: &mut Vec<Input>,
    ) {
        for addr in addrs {
            let ev = Event {
                kind: EventKind::Free as u32,
                func: AllocFn::Free as u32,
                tgid,
                tid,
                old_addr: addr,
                ..Event::default()
            };
            self.push_event(EventKind::Free, &ev, None, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{KEPT_NS, SHARE_NS, ThreadStacks};

    #[test]
    fn a_thread_stack_is_completed_from_its_previous_one() {
        let mut t = ThreadStacks::default();
        assert_eq!(t.complete(1, 10, 1, &[3, 2, 1], 0), Some(&[3, 2, 1][..]));
        // Same stack again: nothing sent, all three shared.
        assert_eq!(t.complete(1, 10, 2, &[], 3), Some(&[3, 2, 1][..]));
        // A new innermost part under the two outermost frames.
        assert_eq!(t.complete(1, 10, 3, &[5, 4], 2), Some(&[5, 4, 2, 1][..]));
        assert_eq!(t.complete(1, 10, 4, &[6], 3), Some(&[6, 4, 2, 1][..]));
        // Another thread has its own.
        assert_eq!(t.complete(1, 11, 5, &[7], 0), Some(&[7][..]));
        assert_eq!(t.complete(1, 10, 6, &[], 4), Some(&[6, 4, 2, 1][..]));
    }

    #[test]
    fn a_stack_never_sent_whole_is_not_made_up() {
        let mut t = ThreadStacks::default();
        assert_eq!(t.complete(1, 10, 1, &[9], 2), None, "nothing to share from");
        assert_eq!(t.complete(1, 10, 2, &[2, 1], 0), Some(&[2, 1][..]));
        assert_eq!(
            t.complete(1, 10, 3, &[3], 3),
            None,
            "more shared than known"
        );
        assert_eq!(t.complete(1, 10, 4, &[], 1), None, "forgotten after that");
        assert_eq!(t.complete(1, 10, 5, &[2, 1], 0), Some(&[2, 1][..]));
        t.forget(1);
        assert_eq!(t.complete(1, 10, 6, &[], 2), None, "the process exited");
        assert_eq!(t.complete(2, 10, 7, &[8], 0), Some(&[8][..]));
        t.clear();
        assert_eq!(t.complete(2, 10, 8, &[], 1), None, "cleared");
    }

    #[test]
    fn the_stacks_of_threads_gone_quiet_go_but_not_before_the_kernel_stops_sharing() {
        let mut t = ThreadStacks::default();
        let s = 1_000_000_000;
        for tid in 0..1000 {
            t.complete(1, tid, s, &[tid as u64 + 4096], 0);
        }
        // Thread 5 allocates again just within the sharing window: its stack is still there.
        assert_eq!(
            t.complete(1, 5, s + SHARE_NS, &[], 1),
            Some(&[5 + 4096][..])
        );
        assert_eq!(t.len(), 1000);
        // Past KEPT_NS the quiet threads' stacks go; thread 5's (younger) stays.
        t.complete(1, 7777, s + KEPT_NS + 1, &[1 << 20], 0);
        assert_eq!(t.len(), 2);
        assert_eq!(
            t.complete(1, 5, s + KEPT_NS + 2, &[], 1),
            Some(&[5 + 4096][..])
        );
        assert_eq!(t.complete(1, 6, s + KEPT_NS + 3, &[], 1), None);
    }
}
