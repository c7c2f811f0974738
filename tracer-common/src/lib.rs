//! The kernel ↔ user ABI of leaktracer: the records the eBPF programs write into the ring buffer,
//! the values of their maps, and the limits both halves agree on. Nothing else is shared.
//!
//! Every type is `#[repr(C)]`, has no `bool` and no implicit padding, and its size is pinned so that a
//! change on one side without the other fails to compile.
#![no_std]

use core::mem::size_of;

/// Deepest user stack captured per allocation. Deeper stacks are truncated (the record says so).
pub const MAX_FRAMES: usize = 64;
/// Traced processes (tgids) the kernel filter can hold at once.
pub const MAX_TRACED: u32 = 16_384;
/// Ring buffer size in bytes (a power of two, a multiple of the page size); `--ring-mb` sets it
/// at load time.
pub const RINGBUF_BYTES: u32 = 32 << 20;

/// What a record in the ring buffer says happened.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A heap block was returned: `addr`, `size`; `func` says which allocator function.
    Alloc = 1,
    /// `free(old_addr)`.
    Free = 2,
    /// `realloc(old_addr, size)` (or reallocarray) returned `addr`.
    Realloc = 3,
    /// `mmap` returned `addr` for `size` bytes; `aux` = prot << 32 | flags.
    Mmap = 4,
    /// `munmap(old_addr, old_size)` succeeded.
    Munmap = 5,
    /// `mremap(old_addr, old_size, size)` returned `addr`.
    Mremap = 6,
    /// `brk(old_addr)` returned the break `addr`.
    Brk = 7,
    /// The traced process `tgid` created process `aux` with clone flags `size`.
    Fork = 8,
    /// `tgid` replaced its image (execve).
    Exec = 9,
    /// The last thread of `tgid` exited.
    Exit = 10,
    /// `mprotect(old_addr, old_size, aux)` succeeded.
    Mprotect = 11,
    /// A device-memory call failed: `size` bytes asked for, `aux` = its error code (cudaError_t or
    /// CUresult). Nothing was allocated.
    AllocFailed = 12,
    /// cuMemMap: the physical handle `aux` mapped at device address `addr` for `size` bytes,
    /// `old_addr` = the offset into the handle.
    DeviceMap = 13,
    /// cuMemUnmap(`old_addr`, `old_size`) succeeded.
    DeviceUnmap = 14,
    /// The step function (`--step-symbol`) was entered: a training step begins.
    Step = 15,
    /// The Python frames of thread `tid` at its next event with a stack ([`PyStackEvent`]; `aux`
    /// = the number of frames, `size` = 1 when the walk stopped at [`MAX_PY_FRAMES`]).
    PyFrames = 16,
    /// A [`HeapRecord`].
    HeapAlloc = 17,
    /// A [`FreesEvent`].
    Frees = 18,
    /// A [`HeapRecord`] followed by a [`LeafWords`] block before its frames ([`TRACED_LEAF`]).
    HeapAllocLeaf = 19,
    /// Thread `tid` of `tgid` exited, its unsent frees sent before (not its process's last
    /// thread: that is [`EventKind::Exit`]).
    ThreadExit = 20,
    /// The interpreter of `tgid` began its exit (CPython's `Py_FinalizeEx` was entered): what it
    /// makes and keeps from now on is its teardown's (exit handlers, the modules' clearing), not
    /// its program's.
    Finalize = 21,
}

/// `Event::old_size` of an `Mmap` (of executable file pages) or an `Exec` event whose thread was
/// sent SIGSTOP so that user space can probe the new code before it runs (see [`TRACED_HOLD`]).
pub const STOPPED_FOR_PROBES: u64 = 1;

/// `Event::old_size` of an `Mmap` of executable file pages whose thread was not stopped, though
/// its process is held, because the file is known to hold nothing to probe (`NO_PROBES`): user
/// space looks at this mapping alone (the others it sees may be mapped after it, and come with
/// their own events).
pub const KNOWN_WITHOUT_PROBES: u64 = 2;

/// A bit of an `Mmap` event's `aux` (above the protection, which is in bits 32..40): the mapping
/// was made inside an allocator call (malloc growing its memory: glibc's thread arenas are
/// reserved without access this way, then opened by mprotect as they grow).
pub const MAPPED_BY_ALLOCATOR: u64 = 1 << 63;

/// Where an allocator's result is read at a probe placed right after the call that allocates
/// (`c10::alloc_cpu`'s `posix_memalign(&slot, align, n)`: one probe where an entry and a return
/// probe were): the callee-saved register that holds `n`, and the slot's displacement from the
/// frame pointer. Carried as the attach cookie of the probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallSite {
    /// The size's register: 0 rbx, 1 r12, 2 r13, 3 r14, 4 r15 (x86-64's callee-saved ones but
    /// the frame pointer, which locates the slot).
    pub size_reg: u8,
    pub slot_disp: i32,
}

impl CallSite {
    pub const fn cookie(self) -> u64 {
        (self.size_reg as u64) << 32 | self.slot_disp as u32 as u64
    }

    pub const fn of_cookie(cookie: u64) -> Self {
        Self {
            size_reg: (cookie >> 32) as u8,
            slot_disp: cookie as u32 as i32,
        }
    }
}

/// `TRACED` map value bits. Every traced process has [`TRACED_ON`].
pub const TRACED_ON: u32 = 1;
/// The process is ptrace-held by user space: when it maps executable file pages or execs, the
/// thread is stopped (SIGSTOP, which the holder suppresses) until new libraries are probed.
pub const TRACED_HOLD: u32 = 2;
/// The process's heap allocations go as raw stack copies ([`DeepStackEvent`], at most
/// [`DEEP_HEAP_BYTES`] of stack), unwound in user space with the call-frame information: its code
/// has no frame pointers (or `--unwind cfi` says so).
pub const TRACED_CFI: u32 = 4;
/// The process's heap records carry the top of the stack at the allocator's return
/// ([`LeafWords`], kind [`EventKind::HeapAllocLeaf`]) beside the frame-pointer walk: its code keeps
/// frame pointers but the libraries it calls (libstdc++'s `operator new`, libc's `strdup`) do not,
/// and the walk skips the caller of such a frameless function. User space unwinds those few words
/// with the call-frame information to put the skipped frames back.
pub const TRACED_LEAF: u32 = 8;
/// The malloc family of the process is not traced (`--heap auto`, a Python process before its
/// page-level growth calls for it): its probes, where attached, record nothing for it, and the
/// frees of its CPU tensors come from `c10::free_cpu` instead of `free`.
pub const TRACED_NO_HEAP: u32 = 16;
/// The malloc family is traced for this process alone (`--heap auto`): its probes were attached
/// for its address space, which a forked child does not share, so the child starts without.
pub const TRACED_HEAP_LOCAL: u32 = 32;
/// CPython's object allocator is traced, sampled, for this process (`--heap auto`, for a bounded
/// window once its arenas grow): its `PyObject_*` and `PyMem_*` probes were attached for its
/// address space alone.
pub const TRACED_OBJECTS: u32 = 64;
/// The CPU tensors of the process are not traced (`--heap auto`, a Python process before its
/// page-level growth calls for them): `c10::alloc_cpu` and `c10::free_cpu`, where their probes
/// fire, record nothing for it.
pub const TRACED_NO_TENSORS: u32 = 128;
/// The mean sampling interval of CPython's object allocator, in bytes: Python objects are small
/// (most under 512 bytes) and the window they are sampled in is short (a pure-Python program runs
/// some fifty times slower in it, every call a probe trap), so a leak of a few hundred KiB there
/// gets dozens of samples. A sample costs a few microseconds, each trap one.
pub const OBJECT_SAMPLE_BYTES: u64 = 1 << 10;

/// In an object allocator probe's attach cookie: the probe is on the function the interpreter's
/// allocator table holds (`_PyObject_Free(ctx, p)`), not on the wrapper that jumps to it
/// (`PyObject_Free(p)`), so its arguments come one register later.
pub const COOKIE_ARGS_AFTER_CONTEXT: u64 = 1 << 32;

impl EventKind {
    /// Decodes the wire value.
    pub fn from_u32(v: u32) -> Option<Self> {
        use EventKind::*;
        Some(match v {
            1 => Alloc,
            2 => Free,
            3 => Realloc,
            4 => Mmap,
            5 => Munmap,
            6 => Mremap,
            7 => Brk,
            8 => Fork,
            9 => Exec,
            10 => Exit,
            11 => Mprotect,
            12 => AllocFailed,
            13 => DeviceMap,
            14 => DeviceUnmap,
            15 => Step,
            16 => PyFrames,
            17 => HeapAlloc,
            18 => Frees,
            19 => HeapAllocLeaf,
            20 => ThreadExit,
            21 => Finalize,
            _ => return None,
        })
    }
}

/// The allocator entry point behind an event (`Event::func`). Also the program's pending tag.
/// One byte: every outstanding block user space keeps carries one.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AllocFn {
    Malloc = 1,
    Calloc = 2,
    Realloc = 3,
    Reallocarray = 4,
    PosixMemalign = 5,
    AlignedAlloc = 6,
    Memalign = 7,
    Valloc = 8,
    Pvalloc = 9,
    Free = 10,
    Mmap = 11,
    Munmap = 12,
    Mremap = 13,
    Brk = 14,
    /// libc's sbrk wrapper (probed so the brk it makes gets its caller's stack).
    Sbrk = 15,
    Mprotect = 16,
    // CUDA runtime (libcudart).
    CudaMalloc = 17,
    CudaFree = 18,
    CudaMallocAsync = 19,
    CudaFreeAsync = 20,
    CudaMallocManaged = 21,
    CudaMallocHost = 22,
    CudaHostAlloc = 23,
    CudaFreeHost = 24,
    CudaMallocPitch = 25,
    // CUDA driver (libcuda), virtual memory management included.
    CuMemAlloc = 26,
    CuMemFree = 27,
    CuMemAllocAsync = 28,
    CuMemFreeAsync = 29,
    CuMemAllocHost = 30,
    CuMemHostAlloc = 31,
    CuMemFreeHost = 32,
    CuMemCreate = 33,
    CuMemRelease = 34,
    CuMemMap = 35,
    CuMemUnmap = 36,
    /// PyTorch's CPU tensor allocator (libc10).
    C10AllocCpu = 37,
    /// PyTorch's CUDA caching allocator: a block handed out, and a block given back.
    TorchCudaMalloc = 38,
    TorchCudaFree = 39,
    /// CPython's object allocator (pymalloc): objects, and the memory the interpreter takes
    /// through `PyMem_*`, both served from its arenas (sampled, while a process's objects are
    /// engaged: [`TRACED_OBJECTS`]).
    PyObjectMalloc = 40,
    PyObjectCalloc = 41,
    PyObjectRealloc = 42,
    PyMemMalloc = 43,
    PyMemCalloc = 44,
    PyMemRealloc = 45,
}

impl AllocFn {
    /// A malloc-family allocation (what `--heap sampled` samples).
    pub fn is_heap_alloc(self) -> bool {
        (Self::Malloc as u32..=Self::Pvalloc as u32).contains(&(self as u32))
    }

    /// Decodes the wire value.
    pub fn from_u32(v: u32) -> Option<Self> {
        use AllocFn::*;
        Some(match v {
            1 => Malloc,
            2 => Calloc,
            3 => Realloc,
            4 => Reallocarray,
            5 => PosixMemalign,
            6 => AlignedAlloc,
            7 => Memalign,
            8 => Valloc,
            9 => Pvalloc,
            10 => Free,
            11 => Mmap,
            12 => Munmap,
            13 => Mremap,
            14 => Brk,
            15 => Sbrk,
            16 => Mprotect,
            17 => CudaMalloc,
            18 => CudaFree,
            19 => CudaMallocAsync,
            20 => CudaFreeAsync,
            21 => CudaMallocManaged,
            22 => CudaMallocHost,
            23 => CudaHostAlloc,
            24 => CudaFreeHost,
            25 => CudaMallocPitch,
            26 => CuMemAlloc,
            27 => CuMemFree,
            28 => CuMemAllocAsync,
            29 => CuMemFreeAsync,
            30 => CuMemAllocHost,
            31 => CuMemHostAlloc,
            32 => CuMemFreeHost,
            33 => CuMemCreate,
            34 => CuMemRelease,
            35 => CuMemMap,
            36 => CuMemUnmap,
            37 => C10AllocCpu,
            38 => TorchCudaMalloc,
            39 => TorchCudaFree,
            40 => PyObjectMalloc,
            41 => PyObjectCalloc,
            42 => PyObjectRealloc,
            43 => PyMemMalloc,
            44 => PyMemCalloc,
            45 => PyMemRealloc,
            _ => return None,
        })
    }

    /// A CUDA runtime or driver function (device, managed or pinned host memory).
    pub fn is_cuda(self) -> bool {
        (AllocFn::CudaMalloc as u32..=AllocFn::CuMemUnmap as u32).contains(&(self as u32))
    }

    /// A call of CPython's object allocator (Python objects in its arenas).
    pub fn is_object(self) -> bool {
        Self::is_object_tag(self as u32)
    }

    /// [`AllocFn::is_object`] of a wire value (a pending call's tag), without decoding it.
    pub const fn is_object_tag(tag: u32) -> bool {
        Self::PyObjectMalloc as u32 <= tag && tag <= Self::PyMemRealloc as u32
    }

    /// A call that may move a block: its event is a [`EventKind::Realloc`].
    pub fn is_realloc(self) -> bool {
        matches!(
            self,
            Self::Realloc | Self::Reallocarray | Self::PyObjectRealloc | Self::PyMemRealloc
        )
    }

    /// A call of PyTorch's CUDA caching allocator (blocks inside the segments it reserved).
    pub fn is_torch_cuda(self) -> bool {
        matches!(self, AllocFn::TorchCudaMalloc | AllocFn::TorchCudaFree)
    }

    /// The C name of the function.
    pub fn name(self) -> &'static str {
        use AllocFn::*;
        match self {
            Malloc => "malloc",
            Calloc => "calloc",
            Realloc => "realloc",
            Reallocarray => "reallocarray",
            PosixMemalign => "posix_memalign",
            AlignedAlloc => "aligned_alloc",
            Memalign => "memalign",
            Valloc => "valloc",
            Pvalloc => "pvalloc",
            Free => "free",
            Mmap => "mmap",
            Munmap => "munmap",
            Mremap => "mremap",
            Brk => "brk",
            Sbrk => "sbrk",
            Mprotect => "mprotect",
            CudaMalloc => "cudaMalloc",
            CudaFree => "cudaFree",
            CudaMallocAsync => "cudaMallocAsync",
            CudaFreeAsync => "cudaFreeAsync",
            CudaMallocManaged => "cudaMallocManaged",
            CudaMallocHost => "cudaMallocHost",
            CudaHostAlloc => "cudaHostAlloc",
            CudaFreeHost => "cudaFreeHost",
            CudaMallocPitch => "cudaMallocPitch",
            CuMemAlloc => "cuMemAlloc_v2",
            CuMemFree => "cuMemFree_v2",
            CuMemAllocAsync => "cuMemAllocAsync",
            CuMemFreeAsync => "cuMemFreeAsync",
            CuMemAllocHost => "cuMemAllocHost_v2",
            CuMemHostAlloc => "cuMemHostAlloc",
            CuMemFreeHost => "cuMemFreeHost",
            CuMemCreate => "cuMemCreate",
            CuMemRelease => "cuMemRelease",
            CuMemMap => "cuMemMap",
            CuMemUnmap => "cuMemUnmap",
            C10AllocCpu => "c10::alloc_cpu",
            TorchCudaMalloc => "NativeCachingAllocator::malloc",
            TorchCudaFree => "NativeCachingAllocator::get_allocated_block",
            PyObjectMalloc => "PyObject_Malloc",
            PyObjectCalloc => "PyObject_Calloc",
            PyObjectRealloc => "PyObject_Realloc",
            PyMemMalloc => "PyMem_Malloc",
            PyMemCalloc => "PyMem_Calloc",
            PyMemRealloc => "PyMem_Realloc",
        }
    }
}

/// Frees a thread has made since its last record, at most this many, carried by its next
/// allocation record ([`HeapRecord`]) or sent as a [`FreesEvent`] when the batch is full, when
/// the thread is switched out, and before any other record of its heap calls: the free, the busiest
/// call there is, costs no ring reservation of its own (one reservation a malloc+free pair instead
/// of two).
pub const FREES_PER_RECORD: usize = 7;

/// Thread `tid`'s frees not carried by an allocation record: sent as 16 bytes and the `n` used
/// entries of `addrs`, in the order the frees were made.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FreesEvent {
    /// [`EventKind::Frees`].
    pub kind: u32,
    pub tgid: u32,
    pub n: u32,
    pub tid: u32,
    pub addrs: [u64; FREES_PER_RECORD],
}
const _: () = assert!(size_of::<FreesEvent>() == 72);

/// One ring-buffer record without a stack (frees, unmaps, process events).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Event {
    /// An [`EventKind`] value.
    pub kind: u32,
    /// An [`AllocFn`] value, or 0.
    pub func: u32,
    pub tgid: u32,
    pub tid: u32,
    /// `bpf_ktime_get_ns()` at the event.
    pub ts_ns: u64,
    pub addr: u64,
    pub size: u64,
    pub old_addr: u64,
    pub old_size: u64,
    pub aux: u64,
}
const _: () = assert!(size_of::<Event>() == 64);

/// A record that carries the user stack of the allocating thread.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct StackEvent {
    pub event: Event,
    /// Bytes `bpf_get_stack` wrote into `frames`, or its negative error.
    pub stack_bytes: i64,
    /// The return address at the user stack pointer when it points right after a call instruction:
    /// the caller of a frameless function (libc's syscall wrappers), which the frame-pointer walk
    /// skips. 0 when there is none.
    pub leaf_caller: u64,
    pub frames: [u64; MAX_FRAMES],
}
const _: () = assert!(size_of::<StackEvent>() == 64 + 16 + 8 * MAX_FRAMES);

/// The record of a heap allocation (`--heap full` and `--heap sampled`): the busiest record
/// there is, so it carries only what an allocation needs. A record's cost in the traced thread grows
/// with its bytes (each new cache line of the ring is a miss, ~65 ns here), so this header is 48
/// bytes where a [`StackEvent`]'s is 80, and a thread's stack is sent as a change to its previous
/// one: `n_frames` return addresses (the first is the caller), then, outermost, the last `shared`
/// frames of the thread's previous heap record (a loop allocating from one place sends no frames).
/// Then come the thread's `n_frees` frees made before this allocation, in order (see
/// [`FREES_PER_RECORD`]). The event is a realloc when `func` is realloc or reallocarray, an
/// allocation otherwise.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct HeapRecord {
    /// [`EventKind::HeapAlloc`].
    pub kind: u32,
    pub tgid: u32,
    pub tid: u32,
    /// An [`AllocFn`] value.
    pub func: u8,
    /// Outermost frames taken from the thread's previous heap record.
    pub shared: u8,
    pub n_frames: u8,
    pub n_frees: u8,
    pub ts_ns: u64,
    pub addr: u64,
    pub size: u64,
    /// realloc's old block (0 for none).
    pub old_addr: u64,
}
const _: () = assert!(size_of::<HeapRecord>() == 48);

/// Stack words a [`LeafWords`] block carries: enough for a frameless function or two between the
/// allocator and the program (`operator new` keeps 16 bytes, `strdup` 32).
pub const LEAF_WORDS: usize = 8;

/// The top of the stack at a heap allocator's return, sent between a
/// [`EventKind::HeapAllocLeaf`] record's header and its frames: the registers, and `LEAF_WORDS`
/// words from `sp` up (zeros where they could not be read).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct LeafWords {
    pub sp: u64,
    pub bp: u64,
    pub words: [u64; LEAF_WORDS],
}
const _: () = assert!(size_of::<LeafWords>() == 80);

/// Bytes of raw user stack a [`DeepStackEvent`] carries at most.
pub const DEEP_STACK_BYTES: usize = 16 * 1024;

/// A record with the raw user stack instead of frames, for allocations whose callers are in code
/// built without frame pointers (libtorch, libstdc++, the CUDA libraries): user space unwinds it
/// with the libraries' `.eh_frame` call-frame information. Sent for tensors and device memory,
/// and for the heap allocations of [`TRACED_CFI`] processes, with `HEADER + len + 8 * n_frees`
/// bytes; always longer than any [`StackEvent`], which is how a consumer tells the two apart.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DeepStackEvent {
    pub event: Event,
    /// User registers where the stack was taken (the allocator's return: `ip` in its caller).
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// Bytes of `stack` copied, from `sp` (rounded down to 8) upwards.
    pub len: u32,
    /// A heap record's frees (the thread's not sent yet, made before this allocation, in
    /// order): `n_frees` addresses right after the `len` stack bytes.
    pub n_frees: u32,
    pub stack: [u8; DEEP_STACK_BYTES],
}
const _: () = assert!(size_of::<DeepStackEvent>() == 96 + DEEP_STACK_BYTES);

/// Bytes of stack a heap record of a [`TRACED_CFI`] process carries at most (its site's length
/// comes from [`DeepHintKey`]'s map). A copy costs ~80 ns and ~50 ns per KiB here, and its bytes
/// go through the ring: a heap allocation's callers up to `main` or a thread's start usually fit
/// in a few hundred bytes; a deeper stack is unwound as far as the copy reaches.
pub const DEEP_HEAP_BYTES: usize = 8 * 1024;

/// Key of the kernel's `DEEP_HINTS` map: an allocator's return address (`ip`, in its caller) in
/// a process. Its value: the bytes of stack that unwinding that caller's records has needed,
/// written by user space after it unwinds them, so that a heap record copies that much of the
/// stack (at least [`DEEP_MIN_BYTES`]) and not the whole [`DEEP_HEAP_BYTES`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeepHintKey {
    pub tgid: u32,
    pub pad: u32,
    pub ip: u64,
}

/// Bytes of stack a heap record copies at a site user space has not given a length for yet: a
/// few KiB covers most; a copy cut short is unwound as far as it goes, and user space asks for
/// twice as much at that site from then on.
pub const DEEP_HEAP_FIRST: usize = 2048;

/// Allocation sites with a copy-length hint at most (least recently used go first).
pub const MAX_DEEP_HINTS: u32 = 65_536;

/// Bytes of a [`DeepStackEvent`] before its stack bytes.
pub const DEEP_HEADER: usize = 96;
/// The least stack a deep record carries, so that it is longer than any [`StackEvent`].
pub const DEEP_MIN_BYTES: usize = 512;
const _: () = assert!(DEEP_HEADER + DEEP_MIN_BYTES > size_of::<StackEvent>());

/// An allocator call in flight on one thread (entry seen, return not yet).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Pending {
    /// An [`AllocFn`] value.
    pub func: u32,
    /// Nested allocator entries on this thread (glibc's realloc calls malloc's public address).
    pub depth: u32,
    /// User stack pointer at the outermost entry.
    pub sp: u64,
    pub arg0: u64,
    pub size: u64,
    pub aux: u64,
    pub leaf_caller: u64,
    /// Page-level events (mmap, munmap, mremap, mprotect, brk) raised inside this call, in order.
    /// They are sent when the call returns, with the stack taken there: the frame-pointer chain
    /// inside libc is not reliable, the caller's is.
    pub deferred: [Event; MAX_DEFERRED],
    /// Entries used in `deferred`.
    pub n_deferred: u64,
    /// `--heap sampled`: bytes this thread allocates before its next sample point (drawn from
    /// an exponential distribution whose mean is the sampling interval).
    pub countdown: i64,
    /// The same for CPython's objects, at their own interval ([`OBJECT_SAMPLE_BYTES`]): a
    /// countdown shared with the heap's would sample each kind at the other's rate.
    pub object_countdown: i64,
    /// The stack pointer at the outermost entry of this thread that recorded nothing, its kind
    /// untraced in its process then, while its call may still be in flight (0: none): should its
    /// kind be traced by the time it returns (a layer or a window going in: the probes first,
    /// the flag after), its return, and those of calls nested in it, open no entry and are no
    /// loss.
    pub skipped_sp: u64,
    /// `--heap full`: the thread's process and its frees not yet sent, the first `n_frees` of
    /// `frees` (see [`FREES_PER_RECORD`]).
    pub tgid: u32,
    pub n_frees: u32,
    pub frees: [u64; FREES_PER_RECORD],
    /// Bytes of stack a walk of this thread's allocations reads at once (0: not walked yet): what
    /// its walks have needed, so that a shallow stack is not copied 2 KiB at a time.
    pub walk_hint: u64,
    /// The thread's process's settings (tracer-ebpf's `settings`: Python frames to walk, heap
    /// stacks as raw copies), as found when user space had made `settings_gen - 1` changes
    /// (0: not looked up yet).
    pub settings_gen: u64,
    pub settings: u64,
    /// The CPU (+1) whose slot may still hold a copy of this entry, kept there by a thread
    /// preempted inside the kernel (tracer-ebpf's `entries`); 0: none.
    pub kept_on: u64,
    /// The stack of the thread's last heap record that reached the ring, outermost frame first,
    /// `n_prev` of them, and that record's time: the next record sends only what differs (see
    /// [`HeapRecord`]), unless [`SHARE_NS`] have passed.
    pub n_prev: u64,
    pub prev_ns: u64,
    pub prev: [u64; MAX_FRAMES],
    /// The address of the thread's CPython thread state, as its last Python walk found it (0:
    /// none yet), tried first by the next (tracer-ebpf's `python::emit_frames`).
    pub py_tstate: u64,
}
const _: () =
    assert!(size_of::<Pending>() == 48 + 64 * MAX_DEFERRED + 32 + 64 + 48 + 8 * MAX_FRAMES + 8);

/// A heap record shares frames only with a record of its thread at most this old: user space
/// keeps a thread's last stack twice as long, so the stacks of threads that are gone (user space
/// is not told) do not pile up.
pub const SHARE_NS: u64 = 10_000_000_000;

impl Default for Pending {
    fn default() -> Self {
        // SAFETY: plain integers and arrays of them: all zeros is a value.
        unsafe { core::mem::zeroed() }
    }
}

/// Page-level events parked per allocator call (glibc's arena creation makes four).
pub const MAX_DEFERRED: usize = 4;

/// Indexes of the kernel-side counters (a per-CPU array). Every loss has its own slot.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Ring-buffer reservations that failed (buffer full): events lost.
    RingbufFull = 0,
    /// Inserts into the pending map that failed: an allocation whose return is lost.
    PendingFull = 1,
    /// Inserts into the traced-process map that failed: a child not followed.
    TracedFull = 2,
    /// Returns without a recorded entry (entry lost or probe attached mid-call).
    ReturnWithoutEntry = 3,
    /// `bpf_get_stack` errors (record sent without a stack).
    StackErrors = 4,
    /// Allocator calls made from inside another allocator call (handled by the outer one).
    Nested = 5,
    /// SIGSTOPs for probing a new library that the kernel refused to send: that library was
    /// probed late, its first calls may be missing.
    StopFailed = 6,
    /// `--heap sampled`: sampled allocations not entered in the sampled-address map (full):
    /// their frees will not be matched.
    SampledFull = 7,
}

/// Number of counter slots.
pub const COUNTERS: u32 = 8;

/// `--heap sampled`: sampled heap blocks tracked at once, per machine (the `SAMPLED` map).
pub const MAX_SAMPLED: u32 = 1 << 18;

/// A sampled heap block: its process and address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SampledKey {
    pub tgid: u64,
    pub addr: u64,
}
const _: () = assert!(size_of::<SampledKey>() == 16);

/// Files known to hold nothing leaktracer probes (the `NO_PROBES` map), at most.
pub const MAX_NO_PROBES: u32 = 16_384;

/// A file as the kernel knows it: its file system's device number (`MAJOR << 20 | MINOR`) and
/// its inode. The `NO_PROBES` map's key.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FileKey {
    pub dev: u64,
    pub ino: u64,
}
const _: () = assert!(size_of::<FileKey>() == 16);

/// Byte offsets of the fields that lead from the current task to the inode behind one of its
/// file descriptors, in the running kernel (from its BTF): what the mmap exit reads to know a
/// library mapped before (the `FILE_OFFSETS` map). `task_files` zero: not known.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileOffsets {
    /// `task_struct.files`
    pub task_files: u32,
    /// `files_struct.fdt`
    pub files_fdt: u32,
    /// `fdtable.fd`
    pub fdt_fd: u32,
    /// `file.f_inode`
    pub file_inode: u32,
    /// `inode.i_ino`
    pub inode_ino: u32,
    /// `inode.i_sb`
    pub inode_sb: u32,
    /// `super_block.s_dev`
    pub sb_dev: u32,
    pub pad: u32,
}
const _: () = assert!(size_of::<FileOffsets>() == 32);

/// Processes whose CPython frames are walked at most (the `PY_CONFIG` map).
pub const MAX_PY_PROCESSES: u32 = 4096;
/// Python frames recorded per event at most.
pub const MAX_PY_FRAMES: usize = 128;
/// Thread states looked at, past the GIL holder, to find the calling thread's.
pub const MAX_PY_THREADS: usize = 16;

/// Where a traced process's CPython keeps a thread's frames: the run-time address of
/// `_PyRuntime` and the version's field offsets (tracer/src/python/version.rs). Set by user
/// space when the process maps an interpreter; a forked child inherits its parent's.
///
/// [`PY_NONE`] marks a step a version does not have: no GIL holder in the runtime state (3.12+),
/// no `_PyCFrame` between a thread state and its frame (3.10, 3.13+).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyConfig {
    pub runtime: u64,
    pub runtime_tstate_current: u64,
    pub runtime_main_interp: u64,
    pub interp_threads_head: u64,
    pub tstate_next: u64,
    /// The thread state's owner: its native (kernel) thread id, or with `task_fsbase` its
    /// `pthread_t` (3.10 records no native id).
    pub tstate_native_id: u64,
    pub tstate_cframe: u64,
    pub cframe_frame: u64,
    pub frame_code: u64,
    pub frame_previous: u64,
    pub frame_instr: u64,
    /// The byte sent as a frame's flags: `is_entry` (3.11), `owner` (3.12+); [`PY_NONE`]: none.
    pub frame_entry: u64,
    /// The frame's globals (its module's dict), sent above the flags byte ([`py_flags`]).
    pub frame_globals: u64,
    /// The frame's locals: a module's body runs with its globals as its locals.
    pub frame_locals: u64,
    /// A code object's file name (a `str`), read for a module body's frames ([`PY_MODULE`]).
    pub code_filename: u64,
    /// Where `fsbase` is in the kernel's `task_struct` (from its BTF), when threads are matched
    /// by `pthread_t` (glibc's thread pointer is the thread's fs base); 0 to match native ids.
    pub task_fsbase: u64,
}
const _: () = assert!(size_of::<PyConfig>() == 16 * 8);

/// A [`PyConfig`] offset for a step the version does not have.
pub const PY_NONE: u64 = u64::MAX;

/// A frame's flags word: the byte at its entry field, and above it its globals pointer, or for a
/// module's body ([`PY_MODULE`] set in the byte) its code object's file name. A code object freed
/// and another made at its address (the bodies of two modules imported in turn) runs with another
/// module's globals, so its frames give another stack, resolved anew; the globals cost no read
/// (they are in the frame's bytes already read). A module's body is freed once run, often before
/// its stack is read: its file name, which the module's `__file__` keeps, still names it.
pub const fn py_flags(entry: u8, word: u64) -> u64 {
    (word << 8) | entry as u64
}

/// Set in a [`py_flags`] byte: the frame is a module's body (its locals are its globals), and the
/// word above is its code object's file name.
pub const PY_MODULE: u8 = 0x80;

/// The entry byte of a [`py_flags`] word, as the frame's entry field holds it.
pub const fn py_entry(flags: u64) -> u8 {
    flags as u8 & !PY_MODULE
}

/// The file name (a `str` object's address) a module body's [`py_flags`] word carries; None where
/// it could not be read.
pub const fn py_module_file(flags: u64) -> Option<u64> {
    if flags as u8 & PY_MODULE != 0 && flags >> 8 != 0 {
        Some(flags >> 8)
    } else {
        None
    }
}

/// One Python frame, as read: its code object, the word at the frame's instruction field (an
/// address in the bytecode, or 3.10's instruction index) and its [`py_flags`] (user space reads
/// them per version).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PyFrame {
    pub code: u64,
    pub instr: u64,
    pub flags: u64,
}

/// A record of the Python frames of a thread, innermost first, sent just before that thread's
/// next record with a stack (only the used frames are sent).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PyStackEvent {
    pub event: Event,
    pub frames: [PyFrame; MAX_PY_FRAMES],
}
const _: () = assert!(size_of::<PyStackEvent>() == 64 + 24 * MAX_PY_FRAMES);

#[cfg(feature = "user")]
mod user {
    // SAFETY: plain-old-data structs with explicit layout and no padding (sizes pinned above).
    unsafe impl aya::Pod for super::PyConfig {}
    unsafe impl aya::Pod for super::SampledKey {}
    unsafe impl aya::Pod for super::DeepHintKey {}
    unsafe impl aya::Pod for super::FileKey {}
    unsafe impl aya::Pod for super::FileOffsets {}
}
