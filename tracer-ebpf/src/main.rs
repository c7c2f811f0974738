//! leaktracer's eBPF programs. Allocator uprobes (`heap`), CUDA uprobes (`gpu`), syscall tracepoints (`pages`) and process
//! lifecycle tracepoints (`process`) share the maps and helpers of `shared`. Every program filters on
//! the traced-tgid map first: the probes are attached to whole files, so everything else is noise.
#![cfg_attr(target_arch = "bpf", no_std, no_main)]
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]

#[cfg(target_arch = "bpf")]
mod entries;
#[cfg(target_arch = "bpf")]
mod gpu;
#[cfg(target_arch = "bpf")]
mod heap;
#[cfg(target_arch = "bpf")]
mod objects;
#[cfg(target_arch = "bpf")]
mod pages;
#[cfg(target_arch = "bpf")]
mod process;
#[cfg(target_arch = "bpf")]
mod python;
#[cfg(target_arch = "bpf")]
mod ring;
#[cfg(target_arch = "bpf")]
mod sampling;
#[cfg(target_arch = "bpf")]
mod shared;
#[cfg(target_arch = "bpf")]
mod task_storage;
#[cfg(target_arch = "bpf")]
mod unwind;

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // SAFETY: the verifier rejects any program that could reach a panic; this is never executed.
    unsafe { core::hint::unreachable_unchecked() }
}

/// Host builds (`cargo build --workspace`, clippy) compile this crate as an empty binary.
#[cfg(not(target_arch = "bpf"))]
fn main() {}
