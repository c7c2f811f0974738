//! One traced process's outstanding memory: heap blocks, anonymous mappings and the brk heap, each
//! with its origin. Exact semantics of realloc, munmap, mremap and brk live here.

use serde::Serialize;
use tracer_common::AllocFn;

use super::{
    Kind, Origin,
    blocks::{Block, Blocks},
    device::Device,
    dips::{Dips, PagesKey, pages_key},
    regions::{Regions, Spans},
};
use crate::{
    ingest::{What, unsampled},
    model::{HeapAsked, StackId},
};

const PAGE: u64 = 4096;

/// Kept tensors of a stack all made within this much of the last one kept are a pass's
/// temporaries in flight, not held ([`Process::forget_kept_tensors_but`]).
const IN_FLIGHT_NS: u64 = 1_000_000_000;

pub fn page_up(n: u64) -> u64 {
    n.saturating_add(PAGE - 1) & !(PAGE - 1)
}

/// Things that did not match what the process had, counted rather than guessed.
#[derive(Clone, Copy, Debug, Default, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct Mismatches {
    /// free/realloc of an address with no outstanding block (allocated before tracing began).
    pub unmatched_frees: u64,
    /// Bytes munmap'd that no tracked region covered.
    pub unmatched_unmap_bytes: u64,
    /// Allocations returned at an address that was still outstanding whose free has not arrived
    /// (a free missed; while another thread's free is on its way, see `Process::displaced`).
    pub reused_addresses: u64,
    /// Frees of an address with no outstanding block in a process whose CPU tensors or malloc
    /// family were not traced all along (`--heap auto`): of blocks made while they were not; and
    /// frees missed while their probes went in (an address handed out again before its free was
    /// seen). Expected, not a loss.
    #[serde(default)]
    pub untraced_frees: u64,
    /// Frees of an address with no outstanding block that a thread made after its last
    /// allocation, just before it exited: glibc giving back, through `free`'s public address,
    /// the thread's cache of blocks the program had freed already, and the cache itself (made
    /// inside the allocator). Not a loss.
    #[serde(default)]
    pub thread_exit_frees: u64,
}

/// The program break: everything above `base` up to `top` was grown while traced.
#[derive(Clone, Debug, Default)]
pub struct Brk {
    pub base: Option<u64>,
    pub top: u64,
    pub segments: Regions,
}

/// A traced process.
#[derive(Clone, Debug, Default)]
pub struct Process {
    pub pid: u32,
    pub ppid: Option<u32>,
    pub command: String,
    /// Allocator settings found in its environment (procfs::ALLOCATOR_ENV).
    pub allocator_env: Vec<(String, String)>,
    pub started_ns: u64,
    pub exited_ns: Option<u64>,
    /// When its interpreter began its exit (`Py_FinalizeEx`), where it is a Python process
    /// whose interpreter was found.
    pub finalized_ns: Option<u64>,
    pub execs: u32,
    pub heap: Blocks,
    pub mmaps: Regions,
    /// File-backed mappings (not memory leaktracer counts; see [`Spans`]).
    pub files: Spans,
    pub brk: Brk,
    /// CUDA memory (not inherited at fork).
    pub device: Device,
    pub mismatches: Mismatches,
    /// Frees still to come for blocks already replaced at their address, by address. A thread's
    /// frees reach the ledger with its next record (tracer-common's `FREES_PER_RECORD`), so the
    /// allocator may hand a block freed by one thread to another before that free arrives: the new
    /// block replaces the old one, and the free, when it arrives, is the old block's.
    pub displaced: std::collections::HashMap<u64, u32>,
    /// A block of the malloc family has been seen (its probes record for this process): until
    /// then, under `--heap auto` or `--heap off`, its pages are the only view of its heap.
    pub malloc_seen: bool,
    /// The pages of this process's latest page-level event, while they may still be a tensor's:
    /// (start, end, in the brk heap). A tensor's allocation that maps or grows the heap makes
    /// that page event first, with the syscall's stack (c10::alloc_cpu is probed after its
    /// posix_memalign call, so nothing holds the event back for the tensor's stack); the tensor
    /// that lands in those pages gives them its stack, as the report's folding expects.
    pub last_growth: Option<(u64, u64, bool)>,
    /// The window its Python objects are sampled in, once opened (`Ledger::open_objects`).
    pub objects: Option<super::objects::ObjectWindow>,
    /// Its CPU tensors were traced for a while (`--tensors auto`), and whether they are now.
    pub tensor_layer: Option<TensorLayer>,
    /// When its CPU tensors were last kept as they were (seconds traced), where they are now.
    pub tensors_as_of_s: Option<f64>,
    /// When its CPU tensors were last traced from (seconds traced), where they are now.
    pub tensors_since_s: Option<f64>,
    /// Its CPU tensors or its malloc family were asked for after its start (`--heap auto`): a
    /// free of an address with no block is then of one made while they were not traced.
    pub layer_late: bool,
    /// Why its malloc family was first asked for (`--heap auto`).
    pub heap_asked: Option<HeapAsked>,
    /// Its CPU tensors made up to then (kernel ns) were kept as they were while untraced
    /// (`Ledger::keep_tensors`): a new block at the address of one of them replaces it, as its
    /// free was not seen.
    pub tensors_kept_ns: u64,
    /// Traced again after they were kept: the stacks whose kept tensors stay once the tensors are
    /// traced (`Ledger::forget_tensors_when_traced`).
    pub tensors_held_on_trace: Option<Vec<Option<StackId>>>,
    /// When its malloc family was taken out once its leak was confirmed (seconds traced,
    /// `--heap auto`): its heap blocks are as they were then.
    pub heap_as_of_s: Option<f64>,
    /// Taken out then because its heap held while its pages grew, not for a confirmed leak.
    pub heap_held: bool,
    /// Its pages (brk and mmap) when its malloc family was taken out, and the most they held
    /// since, by the samples: what they grew by after tells how far a confirmed leak went on
    /// (at the end they may have fallen, freed at teardown).
    pub pages_at_heap_out: u64,
    pub pages_most_after_heap: u64,
    /// Its heap blocks made up to then (kernel ns) were kept as they were when its malloc
    /// family was taken out: traced again, a new block at the address of one of them replaces
    /// it, as its free was not seen.
    pub heap_kept_ns: u64,
    /// Times its malloc family was traced again after it was taken out (its pages grew on),
    /// and taken out again; and whether it is traced again now.
    pub heap_again: u32,
    pub heap_retraced: bool,
    /// Its heap blocks set aside when its malloc family was traced again (their frees went
    /// unseen while it was out), until that window decides: put back where it decides nothing.
    pub heap_aside: Vec<(u64, Block)>,
    /// Per thread, its frees of an address with no block since its last allocation: counted as
    /// unmatched until it exits, when they were its allocator's own (`thread_exit_frees`).
    pub tail_frees: std::collections::HashMap<u32, u64>,
    /// How far each stack's CPU tensors fell since the last sample.
    pub dips: Dips<StackId>,
    /// How far each stack's pages of the brk heap fell since the last sample.
    pub brk_dips: Dips<PagesKey>,
}

/// Whether the CPU tensors of a process traced for a while (`--tensors auto`) are traced now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TensorLayer {
    Traced,
    /// Taken out when its memory held; those outstanding then were forgotten.
    TakenOut,
    /// Taken out once their leak was confirmed; those outstanding then are kept as they were,
    /// until they are traced again (see `Process::tensors_as_of_s`).
    Kept,
}

impl Process {
    /// Calls `f` with the kind, bytes and origin of every outstanding block, mapping and brk
    /// segment.
    pub fn for_each_live(&self, mut f: impl FnMut(Kind, u64, &Origin)) {
        let blocks = self.heap.values().chain(self.device.blocks.values());
        let blocks = blocks
            .chain(self.device.handles.values())
            .chain(self.device.torch_blocks.values());
        for b in blocks {
            f(Kind::of(b.origin.func), b.size, &b.origin);
        }
        // An allocator's heaps in mmap'd memory (glibc's thread arenas) are what its brk heap is.
        for (n, o, arena) in self.mmaps.live() {
            f(if arena { Kind::Brk } else { Kind::Mmap }, n, o);
        }
        for (n, o, _) in self.brk.segments.live() {
            f(Kind::Brk, n, o);
        }
    }

    pub fn new(pid: u32, ppid: Option<u32>, command: String, started_ns: u64) -> Self {
        Self {
            pid,
            ppid,
            command,
            started_ns,
            ..Self::default()
        }
    }

    /// A forked child: the parent's outstanding memory, marked inherited (it is really in the
    /// child's address space, and the child may free it).
    pub fn forked_from(parent: &Process, pid: u32, command: Option<String>, ts_ns: u64) -> Self {
        let mut heap = parent.heap.clone();
        heap.values_mut().for_each(|b| b.origin.inherited = true);
        Self {
            pid,
            ppid: Some(parent.pid),
            command: command.unwrap_or_else(|| parent.command.clone()),
            allocator_env: parent.allocator_env.clone(),
            started_ns: ts_ns,
            heap,
            mmaps: parent.mmaps.inherited(),
            files: parent.files.clone(),
            brk: Brk {
                base: parent.brk.base,
                top: parent.brk.top,
                segments: parent.brk.segments.inherited(),
            },
            ..Self::default()
        }
    }

    /// Applies one event of this process (forks and steps are the ledger's); `sampling`: the
    /// heap's mean sampling interval (`Ledger::heap_sampling`). Returns the stack of the heap or
    /// device block a free or realloc released, if any.
    pub fn apply(&mut self, what: What, origin: Origin, sampling: u64) -> Option<StackId> {
        if what.is_page_level() {
            self.last_growth = None;
        }
        let device_func = origin.func.filter(|f| f.is_cuda() || f.is_torch_cuda());
        match what {
            What::Alloc { addr, size } if device_func.is_some() => {
                self.device.alloc(addr, size, origin)
            }
            What::Free { addr } if let Some(f) = device_func => return self.device.free(f, addr),
            What::AllocFailed { code, size } => {
                let func = origin.func.unwrap_or(AllocFn::CudaMalloc);
                self.device.failed(origin.stack, func, code, size)
            }
            What::DeviceMap { addr, size, handle } => self.device.map(addr, size, handle),
            What::DeviceUnmap { addr } => self.device.unmap(addr),
            What::Alloc { addr, size } => self.allocated(addr, size, origin, None, sampling),
            What::Free { addr } => return self.free(addr),
            What::Realloc { old, addr, size } => return self.realloc(old, addr, size, origin),
            What::Mmap {
                addr,
                len,
                anonymous,
                no_access,
                by_allocator,
            } => self.mmap(addr, len, anonymous, no_access, by_allocator, origin),
            What::Mprotect {
                addr,
                len,
                no_access,
            } => self.mprotect(addr, len, no_access),
            What::Munmap { addr, len } => self.munmap(addr, len),
            What::Mremap {
                old,
                old_len,
                addr,
                len,
            } => self.mremap(old, old_len, addr, len),
            What::Brk { result } => self.brk(result, origin),
            What::Exec { command, env } => self.exec(command, env),
            What::Exit => self.exited_ns = Some(origin.ts_ns),
            What::Fork { .. } | What::Step | What::ThreadExit | What::Finalize => {}
        }
        None
    }

    /// Notes an event of thread `tid` (0: not known): an allocation, or `unmatched` frees of an
    /// address with no block (see `tail_frees`).
    pub fn thread_event(&mut self, tid: u32, allocates: bool, unmatched: u64) {
        if tid == 0 {
            return;
        }
        // Every allocation passes here: the map, nearly always empty, is not hashed into then.
        if allocates {
            if !self.tail_frees.is_empty() {
                self.tail_frees.remove(&tid);
            }
        } else if unmatched > 0 {
            *self.tail_frees.entry(tid).or_default() += unmatched;
        }
    }

    /// Thread `tid` exited: its unmatched frees since its last allocation were its allocator's.
    pub fn thread_exited(&mut self, tid: u32) {
        if let Some(n) = self.tail_frees.remove(&tid) {
            self.mismatches.unmatched_frees = self.mismatches.unmatched_frees.saturating_sub(n);
            self.mismatches.thread_exit_frees += n;
        }
    }

    /// Its pages now: its brk heap and its mappings.
    pub fn pages_bytes(&self) -> u64 {
        self.brk.segments.bytes() + self.mmaps.bytes()
    }

    /// execve: a fresh image, nothing of the old address space survives.
    pub fn exec(&mut self, command: Option<String>, env: Option<Vec<(String, String)>>) {
        self.heap.clear();
        self.dips = Dips::default();
        self.brk_dips = Dips::default();
        self.displaced.clear();
        self.tail_frees.clear();
        self.mmaps = Regions::default();
        self.files = Spans::default();
        self.brk = Brk::default();
        self.device = Device::default();
        self.malloc_seen = false;
        self.objects = None;
        self.finalized_ns = None;
        self.execs += 1;
        if let Some(c) = command {
            self.command = c;
        }
        if let Some(env) = env {
            self.allocator_env = env;
        }
    }

    /// A block allocated, by `realloc` when `grown` says by how much it grew (see
    /// `ObjectWindow::made`); `sampling` as in [`Process::apply`].
    fn allocated(
        &mut self,
        addr: u64,
        size: u64,
        origin: Origin,
        grown: Option<u64>,
        sampling: u64,
    ) {
        self.malloc_seen |= Kind::of(origin.func) == Kind::Heap;
        let size = if origin.func == Some(AllocFn::Pvalloc) {
            page_up(size)
        } else {
            size
        };
        let func = origin.func;
        if let Some(w) = &mut self.objects {
            w.made(addr, size, grown, &origin);
        }
        if func == Some(AllocFn::C10AllocCpu) {
            self.pages_to_tensor(addr, size, &origin);
        }
        let block = Block { size, origin };
        self.dips.made(&block);
        let replaced = self.heap.insert(addr, block);
        if let Some(old) = &replaced {
            self.dips.freed(old);
        }
        // Kept as they were while untraced: tensors up to then, and every heap block once the
        // malloc family is taken out (it is not traced again). Their frees are not seen.
        let kept = |old: &Block| match Kind::of(old.origin.func) {
            Kind::Tensor => old.origin.ts_ns <= self.tensors_kept_ns,
            Kind::Heap => {
                (self.heap_as_of_s.is_some() && !self.heap_retraced)
                    || old.origin.ts_ns <= self.heap_kept_ns
            }
            _ => false,
        };
        if replaced.is_some_and(|old| !same_tensor(&old, size, func, sampling) && !kept(&old)) {
            *self.reuses() += 1;
            *self.displaced.entry(addr).or_default() += 1;
        }
    }

    /// Its outstanding blocks of `kind` (heap blocks or CPU tensors) are kept as they were, their
    /// frees unseen from now on: `heap_kept_ns` or `tensors_kept_ns` covers the latest made.
    pub fn keep_made(&mut self, kind: Kind) {
        let made = self
            .heap
            .values()
            .filter(|b| Kind::of(b.origin.func) == kind);
        let latest = made.map(|b| b.origin.ts_ns).max().unwrap_or(0);
        let kept_ns = match kind {
            Kind::Tensor => &mut self.tensors_kept_ns,
            _ => &mut self.heap_kept_ns,
        };
        *kept_ns = (*kept_ns).max(latest);
    }

    /// Forgets its outstanding blocks of `kind` (heap blocks or CPU tensors) but those of the
    /// stacks `keep` picks, and gives them.
    pub fn forget_but(
        &mut self,
        kind: Kind,
        keep: impl Fn(Option<StackId>) -> bool,
    ) -> Vec<(u64, Block)> {
        let gone = self
            .heap
            .iter()
            .filter(|(_, b)| Kind::of(b.origin.func) == kind && !keep(b.origin.stack));
        let addrs: Vec<u64> = gone.map(|(&a, _)| a).collect();
        let heap = &mut self.heap;
        addrs
            .into_iter()
            .filter_map(|a| Some((a, heap.remove(&a)?)))
            .collect()
    }

    /// Its CPU tensors kept as they were (made up to `tensors_kept_ns`) whose stacks `keep` does
    /// not pick are forgotten, and those of a picked stack none of whose kept tensors was made
    /// [`IN_FLIGHT_NS`] before the last: a pass's temporaries, in flight as they were kept (a
    /// Trainer's backward pass, sampled mid-step every time on a loaded machine, read as held
    /// and rising, its temporaries piling up at each keep into a leak at the line that calls
    /// `train()`). Those made since stay.
    pub fn forget_kept_tensors_but(&mut self, keep: impl Fn(Option<StackId>) -> bool) {
        let kept_ns = self.tensors_kept_ns;
        let kept = |b: &Block| Kind::of(b.origin.func) == Kind::Tensor && b.origin.ts_ns <= kept_ns;
        let mut oldest: std::collections::HashMap<Option<StackId>, u64> = Default::default();
        for b in self.heap.values().filter(|b| kept(b)) {
            let at = oldest.entry(b.origin.stack).or_insert(u64::MAX);
            *at = (*at).min(b.origin.ts_ns);
        }
        let held = |s: Option<StackId>| {
            keep(s) && oldest.get(&s).is_some_and(|&t| t + IN_FLIGHT_NS <= kept_ns)
        };
        self.heap.retain(|_, b| !kept(b) || held(b.origin.stack));
    }

    /// Its malloc family is traced again: its heap blocks that `keep` does not pick are set
    /// aside.
    pub fn set_heap_aside(&mut self, keep: impl Fn(Option<StackId>) -> bool) {
        self.heap_aside = self.forget_but(Kind::Heap, keep);
    }

    /// The window traced again decided nothing: its heap is as it was before that window (the
    /// blocks made since go, those set aside come back).
    pub fn heap_aside_back(&mut self) {
        let before = self.heap_kept_ns;
        self.heap
            .retain(|_, b| Kind::of(b.origin.func) != Kind::Heap || b.origin.ts_ns <= before);
        for (addr, b) in std::mem::take(&mut self.heap_aside) {
            if self.heap.get(&addr).is_none() {
                self.heap.insert(addr, b);
            }
        }
    }

    /// Gives the pages of [`Process::last_growth`] the stack of the tensor at [addr, addr + size)
    /// when it lies in them.
    fn pages_to_tensor(&mut self, addr: u64, size: u64, origin: &Origin) {
        let Some((start, end, brk)) = self.last_growth.take() else {
            return;
        };
        if addr >= end || addr.saturating_add(size) <= start {
            return;
        }
        let regions = if brk {
            &mut self.brk.segments
        } else {
            &mut self.mmaps
        };
        if brk && let Some((was, bytes)) = regions.at(start) {
            let was = pages_key(was);
            self.brk_dips.fall(was, bytes);
            self.brk_dips.rise((origin.stack, was.1), bytes);
        }
        regions.set_stack(start, origin.stack);
    }

    /// A free: of a replaced block whose free was still to come (see `displaced`), else of the
    /// outstanding block. Should the free in fact be the new block's (its own thread's free came
    /// first), the old block's, arriving next, releases the new one: the same end state.
    /// Returns the released block's stack.
    pub fn free(&mut self, addr: u64) -> Option<StackId> {
        if let Some(n) = self.displaced.get_mut(&addr) {
            *n -= 1;
            if *n == 0 {
                self.displaced.remove(&addr);
            }
            let reuses = self.reuses();
            *reuses = reuses.saturating_sub(1);
            return None;
        }
        self.release(addr)
    }

    /// Where an address handed out again before its free was seen is counted: in a process whose
    /// layer went in late, a free missed while its probes went in (they do not all go in at one
    /// instant) is untraced, as frees of what was made before them are; else it is a mismatch.
    fn reuses(&mut self) -> &mut u64 {
        if self.layer_late {
            &mut self.mismatches.untraced_frees
        } else {
            &mut self.mismatches.reused_addresses
        }
    }

    /// Removes the outstanding block at `addr` (counted when there is none); its stack.
    fn release(&mut self, addr: u64) -> Option<StackId> {
        let Some(block) = self.heap.remove(&addr) else {
            tracing::debug!(
                pid = self.pid,
                addr,
                "free of an address with no outstanding block"
            );
            if self.layer_late {
                self.mismatches.untraced_frees += 1;
            } else {
                self.mismatches.unmatched_frees += 1;
            }
            return None;
        };
        self.dips.freed(&block);
        block.origin.stack
    }

    /// realloc(old, size) returned `new`: NULL old is malloc, NULL result (size 0) is free, anything
    /// else moves or resizes the block, which now belongs to the realloc call's stack.
    /// Returns the released block's stack.
    pub fn realloc(&mut self, old: u64, new: u64, size: u64, origin: Origin) -> Option<StackId> {
        // What it grew by: from the outstanding block's size; nothing is known of a block not
        // recorded (made before the window, or not sampled).
        let grown = match self.heap.get(&old) {
            _ if old == 0 => size,
            Some(b) => size.saturating_sub(b.size),
            None => 0,
        };
        // The caller holds `old`: the outstanding block's, whatever frees are to come.
        let released = if old != 0 { self.release(old) } else { None };
        self.malloc_seen |= Kind::of(origin.func) == Kind::Heap;
        if new != 0 {
            self.allocated(new, size, origin, Some(grown), 0);
        }
        released
    }

    /// A successful mmap: anonymous mappings are tracked (without access: reserved; reserved inside
    /// an allocator call: an allocator's heap); any mapping replaces what it covers.
    pub fn mmap(
        &mut self,
        addr: u64,
        len: u64,
        anonymous: bool,
        no_access: bool,
        by_allocator: bool,
        origin: Origin,
    ) {
        let end = addr.saturating_add(page_up(len));
        if anonymous {
            self.files.remove(addr, end);
        }
        if anonymous && no_access && by_allocator {
            self.mmaps.insert_arena(addr, end, origin);
        } else if anonymous {
            self.mmaps.insert(addr, end, origin, no_access);
            self.last_growth = (!no_access).then_some((addr, end, false));
        } else {
            self.mmaps.remove(addr, end);
            self.files.insert(addr, end);
        }
    }

    /// mprotect: PROT_NONE turns memory back into reserved address space, anything else opens it.
    pub fn mprotect(&mut self, addr: u64, len: u64, no_access: bool) {
        self.mmaps
            .protect(addr, addr.saturating_add(page_up(len)), no_access);
    }

    pub fn munmap(&mut self, addr: u64, len: u64) {
        let len = page_up(len);
        let end = addr.saturating_add(len);
        let removed = self.mmaps.remove(addr, end) + self.files.remove(addr, end);
        self.mismatches.unmatched_unmap_bytes += len - removed.min(len);
        self.unmapped_blocks(addr, end);
    }

    /// The pages of [start, end) were unmapped: a large block that began there was freed. One of
    /// a layer out now (kept as it was: `--heap auto`) goes, as its free will not be seen; one
    /// of a layer traced has its free on the way. (An accumulator grown by copying, kept as it
    /// was at each confirmation, held every copy it ever made where a new block at the same
    /// address was all that took one away.)
    fn unmapped_blocks(&mut self, start: u64, end: u64) {
        for addr in self.heap.large_in(start, end) {
            if !self.heap.get(&addr).is_some_and(|b| self.untraced_now(b)) {
                continue;
            }
            if let Some(b) = self.heap.remove(&addr) {
                self.dips.freed(&b);
            }
        }
    }

    /// Whether `b`'s layer is out now, so that its free would not be seen.
    fn untraced_now(&self, b: &Block) -> bool {
        match Kind::of(b.origin.func) {
            Kind::Tensor => matches!(
                self.tensor_layer,
                Some(TensorLayer::Kept | TensorLayer::TakenOut)
            ),
            Kind::Heap => self.heap_as_of_s.is_some() && !self.heap_retraced,
            _ => false,
        }
    }

    /// mremap keeps the original region's origin at its new place and size.
    pub fn mremap(&mut self, old: u64, old_len: u64, new: u64, new_len: u64) {
        let Some(origin) = self.mmaps.origin_at(old).cloned() else {
            return; // a file mapping or one from before tracing: not ours to count
        };
        let reserved = self.mmaps.is_reserved(old);
        let old_end = old.saturating_add(page_up(old_len));
        self.mmaps.remove(old, old_end);
        self.unmapped_blocks(old, old_end);
        let end = new.saturating_add(page_up(new_len));
        self.mmaps.insert(new, end, origin, reserved);
    }

    /// brk(requested) returned `result`, the new break. Growth belongs to the caller; shrinking
    /// releases the highest segments first.
    pub fn brk(&mut self, result: u64, origin: Origin) {
        let Some(_) = self.brk.base else {
            self.brk.base = Some(result);
            self.brk.top = result;
            return;
        };
        if result > self.brk.top {
            self.brk_dips
                .rise(pages_key(&origin), result - self.brk.top);
            self.brk
                .segments
                .insert(self.brk.top, result, origin, false);
            self.last_growth = Some((self.brk.top, result, true));
        } else if result < self.brk.top {
            for (was, bytes) in self.brk.segments.overlaps(result, self.brk.top) {
                self.brk_dips.fall(pages_key(&was), bytes);
            }
            self.brk.segments.remove(result, self.brk.top);
        }
        self.brk.top = result;
    }
}

/// Whether `old` is the block a tensor of `size` just made by `func` was recorded as first:
/// c10::alloc_cpu probed after its posix_memalign call, in a process whose malloc family is
/// traced, has posix_memalign's return record the block, then the tensor (one block, told as
/// a tensor, with the stack of alloc_cpu's caller). Under `--heap sampled` (`sampling`, the mean
/// interval) a recorded posix_memalign block counts for more than its size; tensors are all
/// recorded, at their size.
fn same_tensor(old: &Block, size: u64, func: Option<AllocFn>, sampling: u64) -> bool {
    func == Some(AllocFn::C10AllocCpu)
        && old.origin.func == Some(AllocFn::PosixMemalign)
        && (old.size == size || old.size == unsampled(size, sampling))
}
