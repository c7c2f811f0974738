//! Builds the eBPF programs (tracer-ebpf) with the same pinned toolchain as the rest of the
//! workspace, into OUT_DIR/tracer, embedded by probes/loader.rs.
use anyhow::{Context as _, anyhow};
// Build-dependency only so that changes to the eBPF crate rebuild this one.
use tracer_ebpf as _;

fn main() -> anyhow::Result<()> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../tracer-ebpf");
    let toolchain = match std::env::var("RUSTUP_TOOLCHAIN") {
        Ok(tc) if tc.starts_with("nightly") => tc,
        _ => pinned_toolchain()?,
    };
    println!("cargo::rerun-if-env-changed=RUSTUP_TOOLCHAIN");
    let package = aya_build::Package {
        name: "tracer-ebpf",
        root_dir: root,
        ..Default::default()
    };
    aya_build::build_ebpf([package], aya_build::Toolchain::Custom(&toolchain)).context(
        "building the eBPF programs (run scripts/setup.sh for the toolchain and bpf-linker)",
    )
}

/// The channel named in rust-toolchain.toml.
fn pinned_toolchain() -> anyhow::Result<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../rust-toolchain.toml");
    println!("cargo::rerun-if-changed={path}");
    let text = std::fs::read_to_string(path).context("reading rust-toolchain.toml")?;
    text.lines()
        .find_map(|l| {
            l.trim().strip_prefix("channel").map(|v| {
                v.trim_start_matches([' ', '=', '"'])
                    .trim_end_matches('"')
                    .to_string()
            })
        })
        .ok_or_else(|| anyhow!("no channel in rust-toolchain.toml"))
}
