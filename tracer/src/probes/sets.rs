//! What leaktracer probes: the function sets it looks for in each library (the malloc family,
//! the CUDA runtime and driver, PyTorch's allocators) and the tracepoints of the page level.

use iced_x86::Register;

use tracer_common::AllocFn;

/// A function leaktracer probes: its symbol (a C++ one by demangled name), entry and return
/// programs, and the argument registers its entry program reads.
pub(super) struct ProbeFn {
    pub(super) name: &'static str,
    pub(super) entry: &'static str,
    pub(super) ret: Option<&'static str>,
    pub(super) args: &'static [Register],
    /// For multi-attach programs (one link per library and program): the function's cookie.
    pub(super) cookie: Option<u64>,
    /// One probe for the entry and the return where the function's code allows it (see
    /// `placement::after_call`).
    pub(super) after_call: Option<AfterCall>,
    /// A wrapper that jumps through a table of functions (`placement::jump_slot`): where its own
    /// code has no instruction to probe cheaply, the function the process's table holds is
    /// probed instead (a process's probes only).
    pub(super) through_table: bool,
}

/// A probe right after the function's call to `callee`, running `program` with the call's
/// [`tracer_common::CallSite`] as its cookie.
pub(super) struct AfterCall {
    pub(super) callee: &'static str,
    pub(super) program: &'static str,
}

const fn heap_fn(
    name: &'static str,
    entry: &'static str,
    args: &'static [Register],
    returns: bool,
) -> ProbeFn {
    ProbeFn {
        name,
        entry,
        ret: if returns { Some("alloc_return") } else { None },
        args,
        cookie: None,
        after_call: None,
        through_table: false,
    }
}

/// A function probed by a shared multi-attach entry program, told apart by its cookie (`func`),
/// and a shared return program: one link per library and program.
const fn cookie_fn(
    name: &'static str,
    func: AllocFn,
    entry: &'static str,
    ret: &'static str,
    args: &'static [Register],
) -> ProbeFn {
    ProbeFn {
        name,
        entry,
        ret: Some(ret),
        args,
        cookie: Some(func as u64),
        after_call: None,
        through_table: false,
    }
}

/// The return program of the device calls and of PyTorch's caching allocator's `malloc`, told
/// apart by their cookies.
const DEVICE_RETURN: &str = "device_return";

/// A CUDA function.
const fn cuda_fn(name: &'static str, func: AllocFn) -> ProbeFn {
    cookie_fn(name, func, "cuda_enter", DEVICE_RETURN, &[])
}

/// Functions probed together in one library, and the symbol that says the library has them.
pub(super) struct ProbeSet {
    pub(super) role: &'static str,
    pub(super) marker: &'static str,
    /// Only libraries whose file name starts with this (None: any file defining `marker`).
    pub(super) file_prefix: Option<&'static str>,
    pub(super) fns: &'static [ProbeFn],
    /// Hot functions: the probe offset is chosen from the prologue (placement.rs). Others take
    /// the entry, whatever it costs.
    pub(super) placed: bool,
}

impl ProbeSet {
    /// The malloc family and PyTorch's CPU allocator (what `--no-heap` leaves out).
    pub(super) fn heap(&self) -> bool {
        self.role == HEAP.role || self.role == TORCH_CPU.role
    }
}

const RDI: &[Register] = &[Register::RDI];
const RDI_RSI: &[Register] = &[Register::RDI, Register::RSI];
const RDI_RSI_RDX: &[Register] = &[Register::RDI, Register::RSI, Register::RDX];

pub(super) const HEAP: ProbeSet = ProbeSet {
    role: "libc",
    marker: "malloc",
    file_prefix: Some("libc.so"),
    placed: true,
    fns: &[
        heap_fn("malloc", "malloc_enter", RDI, true),
        heap_fn("calloc", "calloc_enter", RDI_RSI, true),
        heap_fn("realloc", "realloc_enter", RDI_RSI, true),
        heap_fn("reallocarray", "reallocarray_enter", RDI_RSI_RDX, true),
        heap_fn("posix_memalign", "posix_memalign_enter", RDI_RSI_RDX, true),
        heap_fn("aligned_alloc", "aligned_alloc_enter", RDI_RSI, true),
        heap_fn("memalign", "memalign_enter", RDI_RSI, true),
        heap_fn("valloc", "valloc_enter", RDI, true),
        heap_fn("pvalloc", "pvalloc_enter", RDI, true),
        heap_fn("free", "free_enter", RDI, false),
        // Syscall wrappers probed so their page-level events carry the caller's stack.
        heap_fn("sbrk", "sbrk_enter", &[], true),
        heap_fn("mremap", "mremap_wrapper_enter", &[], true),
    ],
};

const CUDA_RUNTIME: ProbeSet = ProbeSet {
    role: "cuda-runtime",
    marker: "cudaMalloc",
    file_prefix: None, // libcudart.so.N, or a program that links cudart statically
    placed: false,
    fns: &[
        cuda_fn("cudaMalloc", AllocFn::CudaMalloc),
        cuda_fn("cudaFree", AllocFn::CudaFree),
        cuda_fn("cudaMallocAsync", AllocFn::CudaMallocAsync),
        cuda_fn("cudaFreeAsync", AllocFn::CudaFreeAsync),
        cuda_fn("cudaMallocManaged", AllocFn::CudaMallocManaged),
        cuda_fn("cudaMallocHost", AllocFn::CudaMallocHost),
        cuda_fn("cudaHostAlloc", AllocFn::CudaHostAlloc),
        cuda_fn("cudaFreeHost", AllocFn::CudaFreeHost),
        cuda_fn("cudaMallocPitch", AllocFn::CudaMallocPitch),
    ],
};

const CUDA_DRIVER: ProbeSet = ProbeSet {
    role: "cuda-driver",
    marker: "cuMemAlloc_v2",
    file_prefix: None,
    placed: false,
    fns: &[
        cuda_fn("cuMemAlloc_v2", AllocFn::CuMemAlloc),
        cuda_fn("cuMemFree_v2", AllocFn::CuMemFree),
        cuda_fn("cuMemAllocAsync", AllocFn::CuMemAllocAsync),
        cuda_fn("cuMemFreeAsync", AllocFn::CuMemFreeAsync),
        cuda_fn("cuMemAllocHost_v2", AllocFn::CuMemAllocHost),
        cuda_fn("cuMemHostAlloc", AllocFn::CuMemHostAlloc),
        cuda_fn("cuMemFreeHost", AllocFn::CuMemFreeHost),
        cuda_fn("cuMemCreate", AllocFn::CuMemCreate),
        cuda_fn("cuMemRelease", AllocFn::CuMemRelease),
        cuda_fn("cuMemMap", AllocFn::CuMemMap),
        cuda_fn("cuMemUnmap", AllocFn::CuMemUnmap),
    ],
};

pub(super) const TORCH_CPU: ProbeSet = ProbeSet {
    role: "torch-cpu",
    marker: "c10::alloc_cpu",
    file_prefix: None, // libc10.so
    placed: false,
    fns: &[
        ProbeFn {
            name: "c10::alloc_cpu",
            entry: "c10_alloc_cpu_enter",
            ret: Some("c10_alloc_return"),
            args: RDI,
            cookie: None,
            after_call: Some(AfterCall {
                callee: "posix_memalign",
                program: "c10_alloc_site",
            }),
            through_table: false,
        },
        // Counts only where the malloc family is untraced (`--heap auto` before it is needed);
        // elsewhere the `free` it calls does.
        ProbeFn {
            name: "c10::free_cpu",
            entry: "c10_free_cpu_enter",
            ret: None,
            args: RDI,
            cookie: None,
            after_call: None,
            through_table: false,
        },
    ],
};

/// PyTorch's CUDA caching allocator (libc10_cuda.so, local symbols found by demangled name).
const TORCH_CUDA: ProbeSet = ProbeSet {
    role: "torch-cuda",
    marker: TORCH_CUDA_MALLOC,
    file_prefix: None,
    placed: false,
    fns: &[
        ProbeFn {
            name: TORCH_CUDA_MALLOC,
            entry: "torch_cuda_malloc_enter",
            ret: Some(DEVICE_RETURN),
            args: &[],
            // The shared return program's tell.
            cookie: Some(AllocFn::TorchCudaMalloc as u64),
            after_call: None,
            through_table: false,
        },
        ProbeFn {
            name: "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::get_allocated_block",
            entry: "torch_cuda_free_enter",
            ret: None,
            args: &[],
            cookie: None,
            after_call: None,
            through_table: false,
        },
    ],
};

const TORCH_CUDA_MALLOC: &str =
    "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc";

/// CPython's object allocator (libpython, or an interpreter linked statically): attached for one
/// process at a time, for a window (probes/objects.rs). The `PyMem_*` functions serve from the
/// same arenas.
pub(super) const OBJECTS: ProbeSet = ProbeSet {
    role: "python-objects",
    marker: "PyObject_Malloc",
    file_prefix: None,
    // Every call of these is a trap while they are attached: a single-stepped one (pyenv's
    // PyObject_Malloc starts with `mov %rdi,%rsi`) costs ten emulated ones.
    placed: true,
    fns: &[
        object_fn("PyObject_Malloc", AllocFn::PyObjectMalloc, RDI),
        object_fn("PyObject_Calloc", AllocFn::PyObjectCalloc, RDI_RSI),
        object_fn("PyObject_Realloc", AllocFn::PyObjectRealloc, RDI_RSI),
        object_free("PyObject_Free"),
        object_fn("PyMem_Malloc", AllocFn::PyMemMalloc, RDI),
        object_fn("PyMem_Calloc", AllocFn::PyMemCalloc, RDI_RSI),
        object_fn("PyMem_Realloc", AllocFn::PyMemRealloc, RDI_RSI),
        object_free("PyMem_Free"),
    ],
};

/// An allocating function of CPython's object allocator (the malloc family's return program),
/// reading its arguments from `args`.
const fn object_fn(name: &'static str, func: AllocFn, args: &'static [Register]) -> ProbeFn {
    cookie_fn(name, func, "object_enter", "alloc_return", args)
}

/// A freeing function of CPython's object allocator (one multi-attach program for both).
const fn object_free(name: &'static str) -> ProbeFn {
    ProbeFn {
        name,
        entry: "object_free_enter",
        ret: None,
        args: RDI,
        cookie: Some(0),
        after_call: None,
        // Freeing needs no return probe: one probe on the table's function stands for the
        // wrapper's (both of PyObject_Free and PyMem_Free reach pymalloc's).
        through_table: true,
    }
}

pub(super) const PROBE_SETS: &[&ProbeSet] = &[
    &HEAP,
    &CUDA_RUNTIME,
    &CUDA_DRIVER,
    &TORCH_CPU,
    &TORCH_CUDA,
    &OBJECTS,
];

/// The sets a file defines: those whose marker it defines (`defined`: whether it defines each of
/// `markers`), in [`PROBE_SETS`]' order.
pub(super) fn defined_sets<'a>(
    markers: &'a [&str],
    defined: &'a [bool],
) -> impl Iterator<Item = &'static ProbeSet> + 'a {
    let found = move |set: &&&ProbeSet| {
        markers
            .iter()
            .zip(defined)
            .any(|(&m, &d)| d && m == set.marker)
    };
    PROBE_SETS.iter().filter(found).copied()
}

/// (program, category, tracepoint)
pub(super) const TRACEPOINTS: &[(&str, &str, &str)] = &[
    ("mmap_exit", "syscalls", "sys_exit_mmap"),
    ("munmap_exit", "syscalls", "sys_exit_munmap"),
    ("mprotect_exit", "syscalls", "sys_exit_mprotect"),
    ("mremap_exit", "syscalls", "sys_exit_mremap"),
    ("brk_exit", "syscalls", "sys_exit_brk"),
    ("task_newtask", "task", "task_newtask"),
    ("process_exec", "sched", "sched_process_exec"),
    ("process_exit", "sched", "sched_process_exit"),
];
