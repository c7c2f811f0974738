//! Rebuild the eBPF object when bpf-linker changes (it is the linker of this crate's target).
fn main() {
    if let Ok(linker) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}
