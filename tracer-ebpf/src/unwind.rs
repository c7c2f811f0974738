//! Frame-pointer walk of the user stack, cheaper than `bpf_get_stack` here: the helper reads user
//! memory twice per frame, and each read costs ~80 ns on this kind of machine (a nested VM) whatever
//! its size up to a page or two (a third of it the kernel's hardened-usercopy check of the
//! destination; ~50 ns more per KiB). So the walk copies up to 2 KiB of the stack at a time into a
//! per-CPU buffer and follows the chain in that copy: most walks take one read. The first copy
//! starts at the first frame record, not at the stack pointer: the caller's locals below it are
//! never needed. When the chain leaves the copy, the next copy starts at the frame it went to, not
//! where the last copy ended: a large frame (a `main` with 5 KiB of locals) costs one read, not
//! one per 2 KiB it spans.
//! After [`MAX_READS`] copies, frames are read one by one. A copy's length follows what the
//! thread's walks needed (see [`Stack::extent`]): a shallow stack is copied a few hundred bytes
//! at a time.
//!
//! A program walks at most once ([`capture`] into a per-CPU frame buffer); every record it sends
//! copies from there. Walking per record would multiply the verifier's work by the record count.

use aya_ebpf::{
    cty::c_void,
    helpers::{
        bpf_probe_read_user,
        generated::{bpf_loop, bpf_probe_read_user as read_user_raw},
    },
    macros::map,
    maps::{LruHashMap, PerCpuArray},
};
use tracer_common::{
    DEEP_HEADER, DEEP_HEAP_BYTES, DEEP_HEAP_FIRST, DEEP_MIN_BYTES, DEEP_STACK_BYTES, DeepHintKey,
    DeepStackEvent, Event, FREES_PER_RECORD, HeapRecord, LeafWords, MAX_DEEP_HINTS, MAX_FRAMES,
    StackEvent,
};

const PAGE: u64 = 4096;
/// Bytes the walk copies per read at most: most native stacks' frame chains fit in one.
pub const STEP: u64 = 2048;
/// Copies a walk makes at most (a deep interpreter stack of dense frames takes several).
const MAX_READS: u64 = 8;
/// Buffer words: twice a copy, so that a copy's length needs only a mask for the verifier (a
/// clamp is a branch, and each branch a state to verify in every round of the walk); a power of
/// two so indexes can be masked too.
const BUF_WORDS: usize = 2 * STEP as usize / 8;
const MASK: usize = BUF_WORDS - 1;

#[map]
static STACK_COPY: PerCpuArray<[u64; BUF_WORDS]> = PerCpuArray::with_max_entries(1, 0);

/// The record under construction: `capture` fills its frames, each send rewrites the header and
/// outputs only the used part (a 10-frame record is 160 bytes, not the full 592).
#[map]
static RECORD: PerCpuArray<RecordBuf> = PerCpuArray::with_max_entries(1, 0);

/// A record, room before it and room after its frames: a heap record's frees follow its used
/// frames, and a leaf heap record's header and leaf words go right before its frames, further
/// back than a stack record's header.
#[repr(C)]
pub struct RecordBuf {
    before: [u64; LEAF_ROOM / 8],
    record: StackEvent,
    room: [u64; FREES_PER_RECORD],
}

/// Bytes of [`RecordBuf`] before the record: a [`HeapRecord`] and [`LeafWords`] before the frames
/// are this much longer than a [`StackEvent`]'s header.
pub const LEAF_ROOM: usize =
    size_of::<HeapRecord>() + size_of::<LeafWords>() - (size_of::<StackEvent>() - 8 * MAX_FRAMES);

/// The user registers a walk starts from.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UserRegs {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
}

/// A captured stack: `n` return addresses in this CPU's record buffer.
pub struct Stack {
    pub record: *mut StackEvent,
    pub n: usize,
    /// Bytes of a copy the walk needed: the farthest frame record from its copy's start, and
    /// where a shorter copy than STEP missed the next frame, at least twice that length.
    pub extent: u64,
}

/// The length of a walk's copies for a thread whose walks needed `hint` bytes ([`next_hint`];
/// 0: none yet): a cache line more, in whole lines, at most STEP.
#[inline(always)]
pub fn read_len(hint: u64) -> u64 {
    if hint == 0 {
        STEP
    } else {
        ((hint + 127) & !63).min(STEP)
    }
}

/// The hint after a walk that needed `extent` bytes: it grows at once (a copy too short costs a
/// read, ~120 ns, as much as 2 KiB of copying) and shrinks by a 32nd per walk.
#[inline(always)]
pub fn next_hint(hint: u64, extent: u64) -> u64 {
    let decayed = hint - hint / 32;
    if extent > decayed { extent } else { decayed }
}

/// The walk's loop state. It lives in a map, not in registers: map loads are unknown scalars to the
/// verifier, so every iteration looks alike and its states prune; with the state in registers each
/// iteration is a distinct state and a 64-frame walk exceeds the verifier's budget.
#[repr(C)]
struct Walk {
    fp: u64,
    n: u64,
    /// Bytes in the copy, and the user address its first byte came from.
    loaded: u64,
    base: u64,
    reads: u64,
    /// The farthest frame record needed from a copy's start so far, over the copies left
    /// behind, and in the current copy (frames are met in order up the stack).
    extent: u64,
    last: u64,
    /// Bytes per copy.
    len: u64,
}

#[map]
static WALK: PerCpuArray<Walk> = PerCpuArray::with_max_entries(1, 0);

/// A loop-state word of a per-CPU scratch entry (this walk's, or the Python walk's), read
/// through memory so the verifier sees an unknown scalar.
#[inline(always)]
pub fn get(p: *const u64) -> u64 {
    // SAFETY: callers pass a pointer into this CPU's scratch entry.
    unsafe { core::ptr::read_volatile(p) }
}

#[inline(always)]
pub fn set(p: *mut u64, v: u64) {
    // SAFETY: as above.
    unsafe { core::ptr::write_volatile(p, v) }
}

/// Walks the user stack from `regs` into this CPU's frame buffer (frames[0] = ip), copying
/// `len` bytes at a time (see [`read_len`]).
#[inline(always)]
pub fn capture(regs: &UserRegs, len: u64) -> Option<Stack> {
    let buf = RECORD.get_ptr_mut(0)?;
    // SAFETY: a field of this CPU's record buffer.
    let record = unsafe { &raw mut (*buf).record };
    let n = walk_stack(regs.ip, regs.sp, regs.bp, len);
    let w = WALK.get_ptr(0)?;
    if n == 0 {
        return None;
    }
    Some(Stack {
        record,
        n: n as usize,
        // SAFETY: this CPU's walk state, written by the walk just made.
        extent: get(unsafe { &raw const (*w).extent }),
    })
}

/// The walk of [`capture`]: the number of frames in this CPU's record buffer (0 when a buffer is
/// missing), and in the walk state the bytes of a copy it needed (`extent`).
///
/// A global function (exported: global BTF linkage), which the verifier checks once per program,
/// not again at each call site and on each path to one (see `python::emit_frames`).
#[inline(never)]
#[unsafe(no_mangle)]
pub extern "C" fn walk_stack(ip: u64, sp: u64, bp: u64, len: u64) -> u64 {
    let Some(buf) = RECORD.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: a field of this CPU's record buffer.
    let record = unsafe { &raw mut (*buf).record };
    let Some(buf) = STACK_COPY.get_ptr_mut(0) else {
        return 0;
    };
    let Some(w) = WALK.get_ptr_mut(0) else {
        return 0;
    };
    let regs = UserRegs { ip, sp, bp };
    // SAFETY: per-CPU scratch buffers, used only while this program runs on this CPU.
    let (out, buf, w) = unsafe { (&mut (*record).frames, &mut *buf, &mut *w) };
    out[0] = regs.ip;
    // First copy: `len` bytes from the first frame record, or up to the end of its page where the
    // stack ends sooner. Every record the chain visits lies at or above it; the caller's own
    // locals below it are never needed (with 5 KiB of them, a copy from the stack pointer would
    // take a second read). A frame pointer below the stack pointer is none: the walk ends at the
    // first frame, without a read.
    let base = regs.bp;
    let loaded = if base >= regs.sp && base & 7 == 0 {
        copy_upto(buf, base, len)
    } else {
        0
    };
    set(&mut w.loaded, loaded);
    set(&mut w.base, base);
    set(&mut w.fp, regs.bp);
    set(&mut w.n, 1);
    set(&mut w.reads, 1);
    set(&mut w.extent, 0);
    set(&mut w.last, 0);
    set(&mut w.len, len);
    // Extra rounds: a round that copies records no frame.
    let mut step = WalkCtx { out, buf, w };
    // SAFETY: a helper call; the callback is a static function of this object, its context this
    // function's.
    unsafe {
        bpf_loop(
            (MAX_FRAMES + MAX_READS as usize).div_ceil(ROUNDS_PER_CALL) as u32,
            walk_steps as *const () as *mut c_void,
            (&raw mut step).cast(),
            0,
        )
    };
    // SAFETY: as above.
    let w = unsafe { &mut *step.w };
    set(&mut w.extent, get(&w.extent).max(get(&w.last)));
    get(&w.n)
}

/// What a walk's rounds work on: this CPU's frames, copy and walk state, looked up once per walk.
#[repr(C)]
struct WalkCtx {
    out: *mut [u64; MAX_FRAMES],
    buf: *mut [u64; BUF_WORDS],
    w: *mut Walk,
}

/// Rounds a call of [`walk_steps`] makes: a call costs about 10 ns, a frame in the copy less.
const ROUNDS_PER_CALL: usize = 4;

/// [`ROUNDS_PER_CALL`] rounds of [`walk_stack`], bpf_loop's callback; 1 ends the walk. A
/// callback is verified once, whatever the number of calls.
#[inline(never)]
extern "C" fn walk_steps(_index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: the walk's context (this CPU's scratch buffers), on the caller's stack.
    let (out, buf, w) = unsafe {
        let c = &*ctx.cast::<WalkCtx>();
        (&mut *c.out, &mut *c.buf, &mut *c.w)
    };
    for _ in 0..ROUNDS_PER_CALL {
        if !walk_step(out, buf, w) {
            return 1;
        }
    }
    0
}

/// One round of [`walk_stack`]: records the frame at `fp` and moves up the chain, or copies the
/// stack again where the chain left the copy; false when the walk ends.
#[inline(always)]
fn walk_step(out: &mut [u64; MAX_FRAMES], buf: &mut [u64; BUF_WORDS], w: &mut Walk) -> bool {
    let (fp, base, n) = (get(&w.fp), get(&w.base), get(&w.n));
    if fp < base || fp & 7 != 0 || n >= MAX_FRAMES as u64 || get(&w.loaded) == 0 {
        return false;
    }
    let (off, loaded, reads) = (fp - base, get(&w.loaded), get(&w.reads));
    if off + 16 > loaded && reads < MAX_READS {
        // The chain left the copy: copy again from the frame it went to. When that frame is
        // less than STEP away, a longer copy would have held it: the thread's copies are to be
        // at least twice as long, so that copies shrunk on shallow stacks grow back in a few
        // walks.
        let needed = if off + 16 <= STEP {
            (off + 16).max(2 * get(&w.len))
        } else {
            get(&w.last)
        };
        set(&mut w.extent, needed.max(get(&w.extent)));
        set(&mut w.loaded, copy_upto(buf, fp, get(&w.len)));
        set(&mut w.base, fp);
        set(&mut w.reads, reads + 1);
        return true;
    }
    let (next, ret) = if off + 16 <= loaded {
        set(&mut w.last, off + 16);
        let i = (opaque(off) / 8) as usize;
        (buf[i & MASK], buf[(i + 1) & MASK])
    } else {
        // SAFETY: user memory read that fails cleanly.
        match unsafe { bpf_probe_read_user(fp as *const [u64; 2]) } {
            Ok([next, ret]) => (next, ret),
            Err(_) => return false,
        }
    };
    if ret == 0 {
        return false;
    }
    out[(n as usize) & (MAX_FRAMES - 1)] = ret;
    set(&mut w.n, n + 1);
    if next <= fp {
        return false; // the chain must go up the stack
    }
    set(&mut w.fp, next);
    true
}

/// How many outermost frames of `stack` are the thread's previous heap record's (`prev`,
/// outermost first, `n_prev` of them); `prev` becomes this stack. The loop indexes live in this
/// CPU's walk state, as the walk's do, so that the verifier prunes the iterations.
#[inline(always)]
pub fn share_suffix(stack: &Stack, prev: &mut [u64; MAX_FRAMES], n_prev: &mut u64) -> usize {
    let Some(w) = WALK.get_ptr_mut(0) else {
        *n_prev = 0;
        return 0;
    };
    // SAFETY: this CPU's scratch state and record, filled by `capture` in this program run.
    let (w, frames) = unsafe { (&mut *w, &(*stack.record).frames) };
    let n = (stack.n as u64).min(MAX_FRAMES as u64);
    let np = (*n_prev).min(MAX_FRAMES as u64);
    let last = MAX_FRAMES - 1;
    set(&mut w.n, 0);
    for _ in 0..MAX_FRAMES {
        let i = get(&w.n);
        if i >= n || i >= np {
            break;
        }
        if frames[(opaque(n - 1 - i) as usize) & last] != prev[(i as usize) & last] {
            break;
        }
        set(&mut w.n, i + 1);
    }
    let shared = get(&w.n);
    set(&mut w.fp, shared);
    for _ in 0..MAX_FRAMES {
        let i = get(&w.fp);
        if i >= n {
            break;
        }
        prev[(i as usize) & last] = frames[(opaque(n - 1 - i) as usize) & last];
        set(&mut w.fp, i + 1);
    }
    *n_prev = n;
    shared as usize
}

/// Hides `v` from the optimizer, so that a mask the verifier needs is not folded away because
/// LLVM proved it redundant from a comparison the verifier cannot follow.
#[inline(always)]
pub fn opaque(mut v: u64) -> u64 {
    // SAFETY: a register move onto itself (one real instruction: BTF line info needs one).
    unsafe { core::arch::asm!("{0} = {0}", inout(reg) v) };
    v
}

/// Copies `len` (at most STEP) bytes of user memory at `src` into `buf`, or, when that range is
/// not all mapped (the end of the stack), the bytes up to the end of `src`'s page. Returns the
/// bytes copied (0 when `src`'s page is not mapped either).
#[inline(always)]
fn copy_upto(buf: &mut [u64; BUF_WORDS], src: u64, len: u64) -> u64 {
    if copy(buf, src, len) {
        return len;
    }
    let rest = PAGE - (src & (PAGE - 1));
    if rest < len && copy(buf, src, rest) {
        rest
    } else {
        0
    }
}

/// Copies `len` bytes of user memory at `src` into the start of `buf`.
#[inline(always)]
fn copy(buf: &mut [u64; BUF_WORDS], src: u64, len: u64) -> bool {
    let len = (opaque(len) & (2 * STEP - 1)) as u32;
    // SAFETY: `len < 2 * STEP` bytes, the size of `buf`.
    unsafe { read_user_raw(buf.as_mut_ptr().cast(), len, src as *const _) == 0 }
}

/// The deep record under construction (see [`DeepStackEvent`]).
#[map]
static DEEP: PerCpuArray<DeepStackEvent> = PerCpuArray::with_max_entries(1, 0);

/// Copies up to `max` bytes ([`DEEP_STACK_BYTES`] or [`DEEP_HEAP_BYTES`], a constant) of the user
/// stack from `regs.sp` into this CPU's deep record (page by page: the copy stops at the end of
/// the stack, which ends on a page boundary) and returns the record's bytes to send; None when
/// less than [`DEEP_MIN_BYTES`] could be read.
#[inline(always)]
pub fn deep(regs: &UserRegs, ev: &Event, max: u64) -> Option<&'static [u8]> {
    let d = DEEP.get_ptr_mut(0)?;
    // SAFETY: this CPU's scratch record, used only while this program runs.
    let d = unsafe { &mut *d };
    let base = regs.sp & !7;
    (d.event, d.ip, d.sp, d.bp) = (*ev, regs.ip, base, regs.bp);
    let first = PAGE - (base & (PAGE - 1));
    if !copy_bytes(&mut d.stack, 0, base, first) {
        return None;
    }
    let mut len = first;
    for _ in 0..DEEP_STACK_BYTES as u64 / PAGE {
        if len + PAGE > max || !copy_bytes(&mut d.stack, len, base + len, PAGE) {
            break;
        }
        len += PAGE;
    }
    // What is left of the whole window is less than a page: the window's last page, copied again
    // from where it overlaps (a read of constant size at a constant offset, which the verifier
    // follows). A heap record's smaller window stays as it is: one read fewer.
    const LAST: usize = DEEP_STACK_BYTES - PAGE as usize;
    if max == DEEP_STACK_BYTES as u64 && len + PAGE > max && len < max {
        // SAFETY: LAST + PAGE = DEEP_STACK_BYTES, inside the record's stack bytes.
        let ok = unsafe {
            read_user_raw(
                d.stack.as_mut_ptr().add(LAST).cast(),
                PAGE as u32,
                (base + LAST as u64) as *const _,
            ) == 0
        };
        if ok {
            len = DEEP_STACK_BYTES as u64;
        }
    }
    if len < DEEP_MIN_BYTES as u64 {
        return None;
    }
    (d.len, d.n_frees) = (len as u32, 0);
    Some(deep_record(d, len))
}

/// The bytes of deep record `d` to send: its header and the first `used` bytes after it.
#[inline(always)]
fn deep_record(d: &DeepStackEvent, used: u64) -> &'static [u8] {
    let n = (opaque(used) as usize) & (DEEP_STACK_BYTES * 2 - 1);
    let n = if n > DEEP_STACK_BYTES {
        DEEP_STACK_BYTES
    } else {
        n
    };
    // SAFETY: the header and `n <= DEEP_STACK_BYTES` bytes of this CPU's record (a per-CPU map
    // value, which lives as long as the program).
    unsafe {
        core::slice::from_raw_parts((d as *const DeepStackEvent).cast::<u8>(), DEEP_HEADER + n)
    }
}

/// Bytes of stack each allocation site's records need (see [`DeepHintKey`]), from user space.
#[map]
static DEEP_HINTS: LruHashMap<DeepHintKey, u32> = LruHashMap::with_max_entries(MAX_DEEP_HINTS, 0);

/// A heap allocation's deep record: as many bytes of stack as user space found its site's
/// records need ([`DEEP_HEAP_FIRST`] before it has said), in one read; when that read fails (the
/// stack ends sooner), the whole [`DEEP_HEAP_BYTES`] window page by page, as [`deep`] copies it.
/// The thread's unsent frees (`frees`, `n` of them) follow the stack bytes.
#[inline(always)]
pub fn deep_heap(
    regs: &UserRegs,
    ev: &Event,
    frees: &[u64; FREES_PER_RECORD],
    n: u32,
) -> Option<&'static [u8]> {
    let key = DeepHintKey {
        tgid: ev.tgid,
        pad: 0,
        ip: regs.ip,
    };
    // SAFETY: the value is copied out at once.
    let hint = (unsafe { DEEP_HINTS.get(&key) })
        .copied()
        .unwrap_or(DEEP_HEAP_FIRST as u32);
    let d = DEEP.get_ptr_mut(0)?;
    // SAFETY: this CPU's scratch record, used only while this program runs.
    let d = unsafe { &mut *d };
    let base = regs.sp & !7;
    let want = (opaque(u64::from(hint)) & (2 * DEEP_HEAP_BYTES as u64 - 1))
        .clamp(DEEP_MIN_BYTES as u64, DEEP_HEAP_BYTES as u64);
    // SAFETY: `want <= DEEP_HEAP_BYTES < DEEP_STACK_BYTES` bytes into the record's stack bytes.
    let len = if unsafe {
        read_user_raw(d.stack.as_mut_ptr().cast(), want as u32, base as *const _)
    } == 0
    {
        (d.event, d.ip, d.sp, d.bp) = (*ev, regs.ip, base, regs.bp);
        want
    } else {
        deep(regs, ev, DEEP_HEAP_BYTES as u64)?;
        u64::from(d.len)
    };
    let len = opaque(len) & (2 * DEEP_HEAP_BYTES as u64 - 1);
    let len = if len > DEEP_HEAP_BYTES as u64 {
        DEEP_HEAP_BYTES as u64
    } else {
        len
    };
    let n = (n as usize).min(FREES_PER_RECORD);
    for (i, addr) in frees.iter().enumerate() {
        if i >= n {
            break;
        }
        let at = len as usize + 8 * i;
        // SAFETY: `at + 8 <= DEEP_HEAP_BYTES + 8 * FREES_PER_RECORD < DEEP_STACK_BYTES`.
        unsafe {
            core::ptr::write_unaligned(d.stack.as_mut_ptr().add(at).cast::<u64>(), *addr);
        }
    }
    (d.len, d.n_frees) = (len as u32, n as u32);
    Some(deep_record(d, len + 8 * n as u64))
}

/// Copies `len` (at most a page) bytes of user memory at `src` into `buf` at byte offset `at`.
#[inline(always)]
fn copy_bytes(buf: &mut [u8; DEEP_STACK_BYTES], at: u64, src: u64, len: u64) -> bool {
    let at = (opaque(at) as usize) & (DEEP_STACK_BYTES - 1);
    let len = (len & (2 * PAGE - 1)).min(PAGE) as u32;
    if at + len as usize > DEEP_STACK_BYTES {
        return false;
    }
    // SAFETY: `at + len <= DEEP_STACK_BYTES`, checked above.
    unsafe { read_user_raw(buf.as_mut_ptr().add(at).cast(), len, src as *const _) == 0 }
}
