//! Device-memory probes: the CUDA runtime (libcudart) and driver (libcuda) allocation calls. Every
//! call is probed at entry (its arguments) and at return: the result is an error code, and what was
//! allocated is read from the out-parameter only when that code is 0. Calls are rare and slow next
//! to malloc, so each gets the stack taken at its return, failures included (an out-of-memory error
//! with the stack that asked is what a user wants to see).
//!
//! The runtime calls the driver (cudaMalloc → cuMemAlloc_v2): a call made while another device call
//! of the same thread is in flight deeper on the stack only bumps the depth, so each allocation is
//! counted once, with the outermost call's name and its caller's stack. Device calls keep their own
//! per-thread entry: host allocations inside them (cudart's context setup) are heap calls in their
//! own right.

use aya_ebpf::{
    EbpfContext,
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user, generated::bpf_get_attach_cookie},
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use tracer_common::{AllocFn, Counter, EventKind, Pending};

use crate::{
    shared::{
        GPU_PENDING, TORCH_PENDING, count, emit, emit_deep, event, outermost_return, probe_regs,
        traced_current, untimed_event,
    },
    task_storage::TaskStorage,
};

/// Records a device call's entry: `arg0` is the out-parameter (allocations) or the pointer or
/// handle (frees, maps), `size` the bytes asked for, `aux` a third argument some calls need.
#[inline(always)]
fn enter(ctx: &ProbeContext, func: AllocFn, arg0: u64, size: u64, aux: u64) -> u32 {
    enter_in(&GPU_PENDING, ctx, func, arg0, size, aux)
}

/// As [`enter`], in the per-thread entry `storage` (device calls or PyTorch's allocator).
#[inline(always)]
fn enter_in(
    storage: &TaskStorage<Pending>,
    ctx: &ProbeContext,
    func: AllocFn,
    arg0: u64,
    size: u64,
    aux: u64,
) -> u32 {
    // SAFETY: `regs` is the probe's register block.
    let sp = unsafe { (*ctx.regs).rsp };
    let p = match storage.current() {
        Some(p) if p.depth > 0 && sp <= p.sp => {
            p.depth += 1;
            count(Counter::Nested);
            return 0;
        }
        Some(p) => p,
        None if traced_current().is_none() => return 0,
        None => match storage.current_or_create() {
            Some(p) => p,
            None => {
                count(Counter::PendingFull);
                return 0;
            }
        },
    };
    (p.func, p.depth, p.sp, p.arg0, p.size, p.aux) = (func as u32, 1, sp, arg0, size, aux);
    0
}

#[inline(always)]
fn arg(ctx: &ProbeContext, n: usize) -> u64 {
    ctx.arg::<u64>(n).unwrap_or(0)
}

/// The entry program of every device call: one multi-attach link per library (detaching a
/// uprobe costs a grace period per link, not per function), the function told by its cookie.
#[uprobe(multi)]
pub fn cuda_enter(ctx: ProbeContext) -> u32 {
    // SAFETY: helper on the program's own context.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let Some(func) = AllocFn::from_u32(cookie as u32) else {
        return 0;
    };
    use AllocFn::*;
    let (arg0, size, aux) = match func {
        // (void **ptr, size_t *pitch, size_t width, size_t height): bytes = *pitch × height.
        CudaMallocPitch => (arg(&ctx, 0), arg(&ctx, 3), arg(&ctx, 1)),
        // (CUdeviceptr ptr, size_t size, size_t offset, handle, flags)
        CuMemMap => (arg(&ctx, 0), arg(&ctx, 1), arg(&ctx, 3)),
        // (ptr or handle, …)
        CudaFree | CudaFreeAsync | CudaFreeHost | CuMemFree | CuMemFreeAsync | CuMemFreeHost
        | CuMemRelease => (arg(&ctx, 0), 0, 0),
        // (void **out, size_t size, …), cuMemCreate's out-parameter a handle; cuMemUnmap(ptr, size)
        _ => (arg(&ctx, 0), arg(&ctx, 1), 0),
    };
    enter(&ctx, func, arg0, size, aux)
}

/// Shared return program of every device call above and of PyTorch's caching allocator's
/// `malloc` (told apart by the cookie, the function's): one program to verify where there were
/// two, each 0.17–0.23 s of the verifier's time before a Python command could start.
#[uretprobe(multi)]
pub fn device_return(ctx: RetProbeContext) -> u32 {
    // SAFETY: helper on the program's own context.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let id = bpf_get_current_pid_tgid();
    if cookie == AllocFn::TorchCudaMalloc as u64 {
        if let Some((p, id)) = outermost_return(TORCH_PENDING.current().map(|p| (p, id)), 0) {
            allocated(&ctx, p, id, 0);
        }
        return 0;
    }
    let Some((p, id)) = outermost_return(GPU_PENDING.current().map(|p| (p, id)), 0) else {
        return 0;
    };
    // cudaError_t and CUresult are 32-bit enums; 0 is success.
    let code = ctx.ret::<u64>() as u32;
    finish(&ctx, p, id, code);
    0
}

/// PyTorch's CUDA caching allocator hands out blocks of the segments it reserved with cudaMalloc
/// (or cuMemCreate, with expandable segments). `NativeCachingAllocator::malloc(this, void **ptr,
/// DeviceIndex device, size_t size, cudaStream_t stream)`: the block, read from `*ptr` at return
/// (it throws instead of returning on out-of-memory: then nothing is recorded). The segments it
/// makes inside are device calls, recorded in their own right.
#[uprobe]
pub fn torch_cuda_malloc_enter(ctx: ProbeContext) -> u32 {
    enter_in(
        &TORCH_PENDING,
        &ctx,
        AllocFn::TorchCudaMalloc,
        arg(&ctx, 1),
        arg(&ctx, 3),
        0,
    )
}

/// `NativeCachingAllocator::get_allocated_block(this, void *ptr, bool remove)`: every way a block
/// goes back to the cache (tensor deleters, raw_delete, free) looks the block up with remove set.
#[uprobe]
pub fn torch_cuda_free_enter(ctx: ProbeContext) -> u32 {
    let (ptr, remove) = (arg(&ctx, 1), arg(&ctx, 2) & 0xff);
    if ptr == 0 || remove == 0 {
        return 0;
    }
    let Some((id, _)) = traced_current() else {
        return 0;
    };
    let mut ev = untimed_event(EventKind::Free, AllocFn::TorchCudaFree as u32, id);
    ev.old_addr = ptr;
    emit(&ev);
    0
}

#[inline(always)]
fn finish(ctx: &RetProbeContext, p: &Pending, id: u64, code: u32) {
    let Some(func) = AllocFn::from_u32(p.func) else {
        return;
    };
    match func {
        AllocFn::CudaFree
        | AllocFn::CudaFreeAsync
        | AllocFn::CudaFreeHost
        | AllocFn::CuMemFree
        | AllocFn::CuMemFreeAsync
        | AllocFn::CuMemFreeHost
        | AllocFn::CuMemRelease => {
            // cudaFree(NULL) is a no-op; a failed free released nothing.
            if code == 0 && p.arg0 != 0 {
                let mut ev = untimed_event(EventKind::Free, p.func, id);
                ev.old_addr = p.arg0;
                emit(&ev);
            }
        }
        AllocFn::CuMemMap if code == 0 => {
            let mut ev = event(EventKind::DeviceMap, p.func, id);
            (ev.addr, ev.size, ev.aux) = (p.arg0, p.size, p.aux);
            emit(&ev);
        }
        AllocFn::CuMemUnmap if code == 0 => {
            let mut ev = untimed_event(EventKind::DeviceUnmap, p.func, id);
            (ev.old_addr, ev.old_size) = (p.arg0, p.size);
            emit(&ev);
        }
        AllocFn::CuMemMap | AllocFn::CuMemUnmap => {}
        _ => allocated(ctx, p, id, code),
    }
}

/// The return of an allocating call: the block (read from the out-parameter) or the failure, with
/// the caller's stack either way.
#[inline(always)]
fn allocated(ctx: &RetProbeContext, p: &Pending, id: u64, code: u32) {
    let mut ev = if code != 0 {
        let mut ev = event(EventKind::AllocFailed, p.func, id);
        ev.aux = code as u64;
        ev.size = p.size;
        ev
    } else {
        // SAFETY: user memory reads that fail cleanly.
        let Ok(addr) = (unsafe { bpf_probe_read_user(p.arg0 as *const u64) }) else {
            return;
        };
        let mut ev = event(EventKind::Alloc, p.func, id);
        ev.addr = addr;
        ev.size = if p.func == AllocFn::CudaMallocPitch as u32 {
            // SAFETY: as above.
            let pitch = unsafe { bpf_probe_read_user(p.aux as *const u64) }.unwrap_or(0);
            pitch.wrapping_mul(p.size)
        } else {
            p.size
        };
        ev
    };
    if p.func == AllocFn::CudaMallocPitch as u32 && code != 0 {
        ev.size = 0; // the pitch was never chosen: the bytes asked for are unknown
    }
    // The callers of device allocations are in libraries built without frame pointers (libtorch,
    // the CUDA libraries): the raw stack goes to user space, which unwinds it.
    emit_deep(&probe_regs(ctx.regs), &ev, false, &mut 0);
}
