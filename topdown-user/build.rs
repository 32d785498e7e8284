//! Builds the eBPF object with the pinned nightly and bpf-linker, for `include_bytes_aligned!`.
use anyhow::{Context as _, anyhow};

/// The nightly whose LLVM major (22) matches the LLVM bpf-linker 0.13.0 is built against.
/// Kept in one place with xtask's setup (`xtask/src/toolchain.rs` reads the same value).
const EBPF_TOOLCHAIN: &str = "nightly-2026-06-20";

fn main() -> anyhow::Result<()> {
    // Fuzz builds (`cargo fuzz` sets `--cfg fuzzing`) exercise the parsers only: they skip the
    // eBPF object, whose nested cross build would otherwise run under the sanitizer flags, and
    // embed an empty one (loading it fails with a clear error, which no fuzz target does).
    println!("cargo::rerun-if-env-changed=CARGO_CFG_FUZZING");
    if std::env::var_os("CARGO_CFG_FUZZING").is_some() {
        let out_dir = std::env::var("OUT_DIR").context("OUT_DIR")?;
        for object in ["topdown", "floor"] {
            std::fs::write(std::path::Path::new(&out_dir).join(object), [])
                .context("writing the placeholder eBPF object")?;
        }
        return Ok(());
    }
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
    // aya-build asks for a rerun when the eBPF crate's directory changes, which cargo judged by
    // the directory alone here: an edit to one of the programs' modules (`src/usdt.rs`) left the
    // embedded object stale, built from the sources before it. Each file is named as well.
    rerun_if_any_file_changes(std::path::Path::new(&root_dir))?;
    aya_build::build_ebpf([package], aya_build::Toolchain::Custom(EBPF_TOOLCHAIN))
}

/// `cargo::rerun-if-changed` for every file below `dir`.
fn rerun_if_any_file_changes(dir: &std::path::Path) -> anyhow::Result<()> {
    let entries = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    for entry in entries {
        let path = entry
            .with_context(|| format!("reading {}", dir.display()))?
            .path();
        if path.is_dir() {
            rerun_if_any_file_changes(&path)?;
        } else {
            println!("cargo::rerun-if-changed={}", path.display());
        }
    }
    Ok(())
}
