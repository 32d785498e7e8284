//! Builds the eBPF object with the pinned nightly and bpf-linker, for `include_bytes_aligned!`.
use anyhow::{Context as _, anyhow};

/// The nightly whose LLVM major (22) matches the LLVM bpf-linker 0.13.0 is built against.
/// Kept in one place with xtask's setup (`xtask/src/toolchain.rs` reads the same value).
const EBPF_TOOLCHAIN: &str = "nightly-2026-06-20";

fn main() -> anyhow::Result<()> {
    let metadata = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let ebpf = metadata
        .packages
        .into_iter()
        .find(|p| p.name.as_str() == "topdown-ebpf")
        .ok_or_else(|| anyhow!("topdown-ebpf package not found in the workspace"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("topdown-ebpf manifest has no parent directory"))?
        .as_str()
        .to_owned();
    let package = aya_build::Package {
        name: ebpf.name.as_str(),
        root_dir: &root_dir,
        ..Default::default()
    };
    aya_build::build_ebpf([package], aya_build::Toolchain::Custom(EBPF_TOOLCHAIN))
}
