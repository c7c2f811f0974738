//! Builds the eBPF programs (tracer-ebpf) with the same pinned toolchain as the rest of the
//! workspace, into OUT_DIR/tracer, embedded by probes/mod.rs (OBJECT); and lists the explorer page's
//! built files (web/dist, built by `npm run build` in web/) for api/assets.rs to embed.
use anyhow::{Context as _, anyhow};
// Build-dependency only so that changes to the eBPF crate rebuild this one.
use tracer_ebpf as _;

fn main() -> anyhow::Result<()> {
    embed_web()?;
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

/// Writes OUT_DIR/web_assets.rs: `ASSETS`, each built file of web/dist as (name, bytes). When the
/// page was not built the list is empty and the binary serves a page that says so.
fn embed_web() -> anyhow::Result<()> {
    let dist = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../web/dist"));
    println!("cargo::rerun-if-changed={}", dist.display());
    let mut entries = Vec::new();
    if let Ok(dir) = std::fs::read_dir(dist) {
        for e in dir.flatten() {
            let path = e.path();
            println!("cargo::rerun-if-changed={}", path.display());
            if path.is_file()
                && let Some(name) = path.file_name().and_then(|n| n.to_str())
            {
                entries.push(format!(
                    "    ({name:?}, include_bytes!({:?})),\n",
                    path.canonicalize()?
                ));
            }
        }
    }
    entries.sort();
    if entries.is_empty() {
        println!(
            "cargo::warning=web/dist is missing: the explorer page is not embedded (scripts/setup.sh builds it)"
        );
    }
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("web_assets.rs");
    std::fs::write(
        out,
        format!(
            "pub static ASSETS: &[(&str, &[u8])] = &[\n{}];\n",
            entries.concat()
        ),
    )?;
    Ok(())
}
