//! Ring buffer → decoded events → the ledger's channel. Owns what must be captured while the traced
//! processes live: their executable mappings (maps.rs) and command lines; turns raw kernel stacks
//! into interned [`StackId`]s of (module, file offset) frames before anything leaves this module.

mod copier;
mod event;
mod heap;
mod leaf;
mod maps;
mod sampled;
mod stacks;
mod unwind;

use std::{
    collections::{HashMap, HashSet},
    os::fd::AsRawFd,
    sync::Arc,
    time::Duration,
};

use tokio::{
    io::unix::AsyncFd,
    sync::{mpsc, watch},
};
use tracer_common::{
    AllocFn, DEEP_HEADER, Event as RawEvent, EventKind, KNOWN_WITHOUT_PROBES, MAX_FRAMES,
    OBJECT_SAMPLE_BYTES, STOPPED_FOR_PROBES, StackEvent,
};

pub use crate::probes::KernelCounters;
pub use event::{Batch, Event, Fill, Input, What};
pub use stacks::MAX_STACKS as STACK_CAPACITY;

use crate::{
    hold::{HoldReason, HoldRequest},
    model::{Frame, StackId},
    probes::{KernelChannels, prober::ProbeRequest},
    procfs,
};

const BATCH: usize = 1024;

/// The ingest task: reads until `stop` turns true, then drains what is left and returns.
pub async fn run(
    ch: KernelChannels,
    tx: mpsc::Sender<Batch>,
    mut holds: mpsc::Receiver<HoldRequest>,
    probe: std::sync::mpsc::Sender<ProbeRequest>,
    mut adopted: mpsc::UnboundedReceiver<u32>,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let KernelChannels {
        events,
        stats,
        logger,
        heap_sampling,
        sampled,
        mut stops,
    } = ch;
    let mut copier = copier::Copier::spawn(events)?;
    let mut logs = match logger {
        Some(l) => Some(register(l)?),
        None => None,
    };
    let mut decoder = Decoder {
        probe: Some(probe.clone()),
        heap_sampling,
        sampled: sampled::SampledBlocks::new(sampled),
        ..Decoder::default()
    };
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    loop {
        tokio::select! {
            Some(chunk) = copier.next() => {
                let chunks = vec![chunk];
                decoder.decode_chunks(&chunks, &tx).await?;
                copier.recycle(chunks);
            }
            guard = readable(&mut logs) => {
                let mut guard = guard?;
                guard.get_inner_mut().flush();
                guard.clear_ready();
            }
            Some(req) = holds.recv() => {
                crate::fault::at("hold");
                if req.reason == HoldReason::Fork {
                    // Nothing to drain first: the child's probes are all its fork waits for.
                    let (parent, child) = (req.tgid, req.tid);
                    let _ = probe.send(ProbeRequest::Forked { parent, child });
                    let _ = probe.send(ProbeRequest::Release { ours: false, done: req.done });
                    continue;
                }
                if req.reason == HoldReason::Exit {
                    // Stopped at exit with its memory intact: capture, then drain.
                    decoder.maps.refresh(req.tgid);
                }
                // A stop for new code: its mapping event is in the ring, sent before the signal.
                let chunks = copier.take_all();
                decoder.decode_chunks(&chunks, &tx).await?;
                copier.recycle(chunks);
                // The kernel's own record of its stop decides; the marked record may have been
                // lost to a full ring (counted), and then the library is probed late.
                let marked = decoder.stopped.remove(&req.tid);
                let recorded = stops.remove(&req.tid).is_ok();
                let ours = (marked || recorded) && req.reason == HoldReason::Stop;
                let _ = probe.send(ProbeRequest::Release { ours, done: req.done });
            }
            // `serve` adopts a running process: its mappings are read now, while it lives (a
            // short one may be gone before its events are decoded).
            Some(pid) = adopted.recv() => decoder.maps.refresh(pid),
            _ = tick.tick() => {
                tx.send(vec![Input::Kernel(KernelChannels::counters(&stats))]).await?;
                decoder.report_losses(&tx).await?;
                tx.send(vec![Input::Fill(decoder.fill())]).await?;
            }
            _ = stop.changed() => break,
        }
    }
    decoder.decode_chunks(&copier.take_all(), &tx).await?;
    tracing::debug!(
        bytes = copier.peak_waiting(),
        "records waiting in user memory at most"
    );
    // The final report's table fill: counted once more, after the last events.
    tx.send(vec![Input::Fill(decoder.fill())]).await?;
    if let Some(l) = logs.as_mut() {
        l.get_mut().flush();
    }
    tx.send(vec![Input::Kernel(KernelChannels::counters(&stats))])
        .await?;
    decoder.report_losses(&tx).await?;
    Ok(())
}

/// Little-endian words (a trailing partial word is left out).
fn u64_words(bytes: &[u8]) -> Vec<u64> {
    let (words, _) = bytes.as_chunks::<8>();
    words.iter().map(|w| u64::from_le_bytes(*w)).collect()
}

/// Registers a descriptor this task owns with the reactor.
fn register<T: AsRawFd>(inner: T) -> std::io::Result<AsyncFd<T>> {
    // SAFETY: `inner` owns its descriptor for as long as the AsyncFd holds it; nothing else closes it.
    unsafe { AsyncFd::register(inner) }.map_err(|e| e.into_parts().1)
}

async fn readable<T: AsRawFd>(
    fd: &mut Option<AsyncFd<T>>,
) -> std::io::Result<tokio::io::unix::AsyncFdReadyMutGuard<'_, T>> {
    match fd {
        Some(fd) => fd.readable_mut().await,
        None => std::future::pending().await,
    }
}

/// Decoding state: mappings per process and the stack interner.
#[derive(Default)]
struct Decoder {
    maps: maps::MapsCache,
    stacks: stacks::Interner,
    undecodable: u64,
    /// Reused for each record's raw frames.
    scratch: Vec<u64>,
    unwinders: unwind::Unwinders,
    hints: unwind::CopyHints,
    /// Threads the kernel side stopped for new code, not yet released.
    stopped: HashSet<u32>,
    /// Files with executable pages already announced to the prober.
    code_seen: HashSet<Arc<str>>,
    /// Per process since its last exec, the Python interpreters (executable or libpython) it
    /// was seen mapping: each is announced for each process that maps it, seen before or not
    /// (a Python program's children exec'd anew, as `torchrun`'s workers and
    /// `multiprocessing`'s spawned ones are, have their own interpreter to find).
    python_seen: HashSet<(u32, Arc<str>)>,
    probe: Option<std::sync::mpsc::Sender<ProbeRequest>>,
    /// Per thread: the Python frames (raw triples) sent for its next record with a stack, and
    /// whether the walk stopped with frames left (at [`tracer_common::MAX_PY_FRAMES`]).
    py_pending: HashMap<u32, (Vec<u64>, bool)>,
    python: crate::python::resolve::Resolver,
    /// `--heap sampled`: the mean interval; recorded heap blocks stand for more bytes.
    heap_sampling: u64,
    sampled: sampled::SampledBlocks,
    /// Each thread's last heap stack, which its next heap record's frames complete.
    thread_stacks: heap::ThreadStacks,
    /// Per thread: the (process, allocator return address, stack) of its last record whose stack
    /// is not its walk: a tensor (unwound from its copy), a heap record with leaf words
    /// (spliced). The pages that allocator call mapped come right after it, walked from the same
    /// return: they get its stack, so that its blocks explain them.
    call_stacks: HashMap<u32, (u32, u64, StackId)>,
}

impl Decoder {
    /// How full the tables are.
    fn fill(&self) -> Fill {
        Fill {
            stacks: self.stacks.held() as u64,
            stacks_peak: self.stacks.peak() as u64,
            sampled: self.sampled.held() as u64,
        }
    }

    /// Decodes the records of `chunks`, in order, sending the ledger a batch per [`BATCH`].
    async fn decode_chunks(
        &mut self,
        chunks: &[copier::Chunk],
        tx: &mpsc::Sender<Batch>,
    ) -> anyhow::Result<()> {
        let mut batch = Vec::with_capacity(BATCH);
        for record in chunks.iter().flat_map(copier::Chunk::records) {
            self.decode(record, &mut batch);
            if batch.len() >= BATCH {
                tx.send(std::mem::replace(&mut batch, Vec::with_capacity(BATCH)))
                    .await?;
            }
        }
        if !batch.is_empty() {
            tx.send(batch).await?;
        }
        Ok(())
    }

    async fn report_losses(&self, tx: &mpsc::Sender<Batch>) -> anyhow::Result<()> {
        let stack_table_full = self.stacks.overflowed();
        tx.send(vec![Input::IngestLoss {
            stack_table_full,
            undecodable: self.undecodable,
        }])
        .await?;
        Ok(())
    }

    fn decode(&mut self, bytes: &[u8], out: &mut Vec<Input>) {
        let first = bytes.first_chunk::<4>().map(|k| u32::from_le_bytes(*k));
        match first.and_then(EventKind::from_u32) {
            Some(EventKind::PyFrames) if bytes.len() >= size_of::<RawEvent>() => {
                return self.decode_python(bytes);
            }
            Some(EventKind::HeapAlloc) => return self.decode_heap(bytes, false, out),
            Some(EventKind::HeapAllocLeaf) => return self.decode_heap(bytes, true, out),
            Some(EventKind::Frees) => return self.decode_frees(bytes, out),
            _ => {}
        }
        if bytes.len() > size_of::<StackEvent>() {
            return self.decode_deep(bytes, out);
        }
        let (ev, stack) = if bytes.len() > size_of::<RawEvent>() {
            // A stack record carries only the frames it used: copy into a full one.
            let mut se = StackEvent {
                event: RawEvent::default(),
                stack_bytes: 0,
                leaf_caller: 0,
                frames: [0; MAX_FRAMES],
            };
            let n = bytes.len().min(size_of::<StackEvent>());
            // SAFETY: at most size_of::<StackEvent>() bytes into a StackEvent (plain data).
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), (&raw mut se).cast::<u8>(), n) };
            (se.event, Some(se))
        } else if bytes.len() == size_of::<RawEvent>() {
            // SAFETY: the length was checked; RawEvent is plain data, read unaligned.
            (
                unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<RawEvent>()) },
                None,
            )
        } else {
            self.undecodable += 1;
            return;
        };
        let Some(kind) = EventKind::from_u32(ev.kind) else {
            self.undecodable += 1;
            return;
        };
        tracing::trace!(
            ?kind,
            func = ev.func,
            tgid = ev.tgid,
            addr = ev.addr,
            size = ev.size,
            old = ev.old_addr,
            old_size = ev.old_size,
            aux = ev.aux,
            "event"
        );
        self.observe_process(kind, &ev);
        let ip = stack.as_ref().map(|se| se.frames[0]);
        let stack = stack.and_then(|se| self.intern_walked(se, out));
        // A tensor walked in a Python process: the pages of its call take its stack.
        if let (Some(id), Some(ip), Some(AllocFn::C10AllocCpu)) =
            (stack, ip, AllocFn::from_u32(ev.func))
        {
            self.call_stacks.insert(ev.tid, (ev.tgid, ip, id));
        }
        self.push_event(kind, &ev, stack, out);
    }

    /// A thread's Python frames, for its next record with a stack.
    fn decode_python(&mut self, bytes: &[u8]) {
        // SAFETY: the length was checked; RawEvent is plain data, read unaligned.
        let ev: RawEvent = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
        let frames: Vec<u64> = bytes[size_of::<RawEvent>()..]
            .as_chunks::<8>()
            .0
            .iter()
            .map(|c| u64::from_le_bytes(*c))
            .collect();
        if frames.len() % 3 != 0 || frames.len() / 3 != ev.aux as usize {
            self.undecodable += 1;
            return;
        }
        self.py_pending.insert(ev.tid, (frames, ev.size != 0));
    }

    /// A record with a raw stack: unwound here with the libraries' call-frame information.
    fn decode_deep(&mut self, bytes: &[u8], out: &mut Vec<Input>) {
        // SAFETY: the record is longer than the header; DeepStackEvent's header is plain data.
        let header: [u64; DEEP_HEADER / 8] =
            unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
        // SAFETY: as above; the event is the header's first 64 bytes.
        let ev: RawEvent = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
        let (ip, sp, bp) = (header[8], header[9], header[10]);
        // `len` and `n_frees`, two u32s.
        let (len, n_frees) = (header[11] as u32 as usize, (header[11] >> 32) as usize);
        let frees_at = DEEP_HEADER.saturating_add(len);
        let (Some(kind), Some(stack), Some(frees)) = (
            EventKind::from_u32(ev.kind),
            bytes.get(DEEP_HEADER..frees_at),
            bytes.get(frees_at..frees_at.saturating_add(8 * n_frees)),
        ) else {
            self.undecodable += 1;
            return;
        };
        let frees = frees
            .as_chunks::<8>()
            .0
            .iter()
            .map(|w| u64::from_le_bytes(*w));
        self.push_frees(ev.tgid, ev.tid, frees, out);
        if self
            .maps
            .get(ev.tgid)
            .is_none_or(|m| m.resolve(ip).is_none())
        {
            self.maps.refresh_on_miss(ev.tgid);
        }
        self.scratch.clear();
        let mut cut = false;
        if let Some(maps) = self.maps.get(ev.tgid) {
            let raw = unwind::RawStack {
                tid: ev.tid,
                ip,
                sp,
                bp,
                bytes: stack,
            };
            let reach = self
                .unwinders
                .unwind(ev.tgid, maps, &raw, MAX_FRAMES, &mut self.scratch);
            cut = reach.beyond;
            self.hint_copy(&ev, ip, len, reach);
        }
        let truncated = cut || self.scratch.len() == MAX_FRAMES;
        let id = self.intern_scratch(ev.tgid, ev.tid, truncated, out);
        if let (Some(id), Some(AllocFn::C10AllocCpu)) = (id, AllocFn::from_u32(ev.func)) {
            self.call_stacks.insert(ev.tid, (ev.tgid, ip, id));
        }
        self.push_event(kind, &ev, id, out);
    }

    /// A heap record's copy (or its pages') tells the kernel how much stack its site needs, when
    /// that grew. Tensors and device calls copy their whole window: no hint.
    fn hint_copy(&mut self, ev: &RawEvent, ip: u64, len: usize, reach: unwind::Reach) {
        let whole_window = AllocFn::from_u32(ev.func)
            .is_some_and(|f| f == AllocFn::C10AllocCpu || f.is_cuda() || f.is_torch_cuda());
        if whole_window {
            return;
        }
        let tgid = ev.tgid;
        if let (Some(bytes), Some(probe)) = (self.hints.after(tgid, ip, len, reach), &self.probe) {
            let _ = probe.send(ProbeRequest::CopyHint { tgid, ip, bytes });
        }
    }

    fn push_event(
        &mut self,
        kind: EventKind,
        ev: &RawEvent,
        stack: Option<StackId>,
        out: &mut Vec<Input>,
    ) {
        let command = match kind {
            EventKind::Exec => procfs::command(ev.tgid),
            EventKind::Fork => procfs::command(ev.aux as u32),
            _ => None,
        };
        let func = AllocFn::from_u32(ev.func);
        let heap = func.is_some_and(AllocFn::is_heap_alloc);
        let object = func.is_some_and(AllocFn::is_object);
        if object
            || (self.heap_sampling != 0
                && (heap || matches!(func, Some(AllocFn::Free | AllocFn::C10AllocCpu))))
        {
            self.sampled.observe(kind, ev);
        }
        // Python objects are always sampled, at their own interval.
        let mean = if object {
            OBJECT_SAMPLE_BYTES
        } else if heap {
            self.heap_sampling
        } else {
            0
        };
        let size = if matches!(kind, EventKind::Alloc | EventKind::Realloc) {
            unsampled(ev.size, mean)
        } else {
            ev.size
        };
        let raw = event::Raw {
            kind,
            addr: ev.addr,
            size,
            old_addr: ev.old_addr,
            old_size: ev.old_size,
            aux: ev.aux,
        };
        let env = (kind == EventKind::Exec).then(|| procfs::allocator_env(ev.tgid));
        if let Some(what) = raw.what(command, env) {
            out.push(Input::Event(Event {
                tgid: ev.tgid,
                tid: ev.tid,
                ts_ns: ev.ts_ns,
                func,
                stack,
                what,
            }));
        }
    }

    /// Keeps the mapping snapshots in step with the process's life, and announces new code.
    fn observe_process(&mut self, kind: EventKind, ev: &RawEvent) {
        const PROT_EXEC: u64 = 0x4;
        const MAP_ANONYMOUS: u64 = 0x20;
        let held = ev.old_size == STOPPED_FOR_PROBES;
        // Not stopped, so what else the process maps may be newer than this mapping.
        let only_this = kind == EventKind::Mmap && ev.old_size == KNOWN_WITHOUT_PROBES;
        match kind {
            EventKind::Exec => {
                self.python_seen.retain(|(tgid, _)| *tgid != ev.tgid);
                self.sampled.forget(ev.tgid);
                self.python.forget(ev.tgid);
                self.stacks.forget(ev.tgid); // same addresses, different code now
                self.unwinders.forget(ev.tgid);
                self.hints.forget(ev.tgid);
                self.call_stacks.retain(|_, (t, _, _)| *t != ev.tgid);
                self.maps.refresh(ev.tgid);
            }
            EventKind::Fork => {
                // Where forks are not held (`serve`), the child is seen here, running.
                if let Some(probe) = &self.probe {
                    let child = ev.aux as u32;
                    let _ = probe.send(ProbeRequest::Forked {
                        parent: ev.tgid,
                        child,
                    });
                }
                return self.maps.inherit(ev.tgid, ev.aux as u32);
            }
            // `--heap-after N` with steps: the thread is stopped at step N until the heap
            // probes are in (asked before its release, which the prober answers after).
            EventKind::Step if held => {
                self.stopped.insert(ev.tid);
                if let Some(probe) = &self.probe {
                    let _ = probe.send(ProbeRequest::StartHeap);
                }
                return;
            }
            EventKind::Mmap if (ev.aux >> 32) & PROT_EXEC != 0 && ev.aux & MAP_ANONYMOUS == 0 => {
                self.maps.refresh(ev.tgid)
            }
            EventKind::Exit => {
                if let Some(probe) = &self.probe {
                    let _ = probe.send(ProbeRequest::Exit { tgid: ev.tgid });
                }
                self.python_seen.retain(|(tgid, _)| *tgid != ev.tgid);
                self.sampled.forget(ev.tgid);
                self.thread_stacks.forget(ev.tgid);
                self.python.forget(ev.tgid);
                self.maps.forget(ev.tgid);
                self.unwinders.forget(ev.tgid);
                self.hints.forget(ev.tgid);
                self.call_stacks.retain(|_, (t, _, _)| *t != ev.tgid);
                return self.stacks.forget(ev.tgid);
            }
            _ => return,
        }
        if held {
            self.stopped.insert(ev.tid);
        }
        if let (EventKind::Exec, Some(probe)) = (kind, &self.probe) {
            let _ = probe.send(ProbeRequest::Exec { tgid: ev.tgid });
        }
        let (Some(maps), Some(probe)) = (self.maps.get(ev.tgid), &self.probe) else {
            return;
        };
        let own = only_this.then(|| maps.resolve(ev.addr).map(|(p, _)| p.clone()));
        for path in maps.paths() {
            if own.as_ref().is_some_and(|own| own.as_ref() != Some(path)) {
                continue;
            }
            let python = crate::python::interp::version_of(path).is_some()
                && self.python_seen.insert((ev.tgid, path.clone()));
            if self.code_seen.insert(path.clone()) || python {
                let _ = probe.send(ProbeRequest::Code {
                    tgid: ev.tgid,
                    path: path.clone(),
                    mapped_ns: ev.ts_ns,
                    held,
                });
            }
        }
    }

    /// A walked record's stack, or, for a page event, its thread's last call stack (see
    /// `call_stacks`) when it was walked from the same allocator return (the pages of that call).
    fn intern_walked(&mut self, se: StackEvent, out: &mut Vec<Input>) -> Option<StackId> {
        let n = usize::try_from(se.stack_bytes / 8)
            .unwrap_or(0)
            .min(MAX_FRAMES);
        let tid = se.event.tid;
        let pages = matches!(
            EventKind::from_u32(se.event.kind),
            Some(EventKind::Mmap | EventKind::Mremap | EventKind::Brk | EventKind::Mprotect)
        );
        if let Some(&(tgid, ip, id)) = self.call_stacks.get(&tid)
            && pages
            && tgid == se.event.tgid
            && n > 0
            && se.frames[0] == ip
        {
            self.py_pending.remove(&tid); // the page event's own Python frames: the call's
            return Some(id);
        }
        self.intern(&se, out)
    }

    fn intern(&mut self, se: &StackEvent, out: &mut Vec<Input>) -> Option<StackId> {
        let n = usize::try_from(se.stack_bytes / 8)
            .unwrap_or(0)
            .min(se.frames.len());
        // A walk that ran off the chain ends in zero or tiny "addresses": not frames.
        let raw = &mut self.scratch;
        raw.clear();
        raw.extend(se.frames[..n].iter().copied().take_while(|&a| a >= 4096));
        if se.leaf_caller != 0 && raw.get(1) != Some(&se.leaf_caller) && !raw.is_empty() {
            raw.insert(1, se.leaf_caller);
        }
        let truncated = n == se.frames.len();
        self.intern_scratch(se.event.tgid, se.event.tid, truncated, out)
    }

    /// Interns the raw frames in `scratch`, with the thread's Python frames when it sent some.
    fn intern_scratch(
        &mut self,
        tgid: u32,
        tid: u32,
        truncated: bool,
        out: &mut Vec<Input>,
    ) -> Option<StackId> {
        let mut truncated = truncated;
        if let Some((py, cut)) = self.py_pending.remove(&tid) {
            self.scratch.push(stacks::PY_MARKER);
            self.scratch.extend(py);
            truncated |= cut;
        }
        let Decoder {
            stacks,
            maps,
            python,
            scratch,
            ..
        } = self;
        let mut merge = |native: &[Frame], raw: &[u64]| python.merge(tgid, native, raw);
        let (id, new) = stacks.intern(tgid, scratch, maps, &mut merge)?;
        if let Some(frames) = new {
            out.push(Input::Stack {
                id,
                frames,
                truncated,
            });
        }
        Some(id)
    }
}

/// What a recorded block of `size` bytes stands for under `--heap sampled` with a mean interval
/// of `mean` bytes: it was recorded with probability p = 1 − e^(−size/mean), so it counts as
/// size/p bytes (the unbiased estimate: expected recorded bytes over recorded blocks equal the
/// bytes allocated).
pub fn unsampled(size: u64, mean: u64) -> u64 {
    if size == 0 || mean == 0 {
        return size;
    }
    let p = -(-(size as f64) / mean as f64).exp_m1();
    (size as f64 / p).round() as u64
}

#[cfg(test)]
mod tests {
    use super::unsampled;

    #[test]
    fn sampled_blocks_stand_for_size_over_their_probability() {
        let mean = 512 << 10;
        // 64 KiB: recorded with p = 1 − e^(−1/8) = 0.117503…, so it stands for 557,738 bytes.
        assert_eq!(unsampled(64 << 10, mean), 557_738);
        // Far above the interval: always recorded, counts as itself.
        assert_eq!(unsampled(64 << 20, mean), 64 << 20);
        // Tiny blocks stand for about one interval each.
        assert_eq!(unsampled(16, mean), mean + 8);
        assert_eq!(unsampled(0, mean), 0);
        assert_eq!(unsampled(100, 0), 100, "no sampling");
    }
}
