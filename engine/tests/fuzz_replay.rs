//! The fuzz targets' inputs, replayed on stable Rust: every file in `fuzz/corpus-seeds/<target>/`
//! (a small checked-in corpus, crash reproducers among them, named `crash-*`) and in
//! `fuzz/artifacts/<target>/` (inputs a local `cargo fuzz` run found failing, when there are
//! any) goes through the same function its cargo-fuzz target calls (`fuzz/src/lib.rs`,
//! included here). A panic on any of them fails the test with the file's name; a stack
//! overflow aborts it. So a regression that the fuzz targets would catch shows in the plain
//! `cargo test`, without nightly.

#![allow(clippy::unwrap_used)]

#[path = "../../fuzz/src/lib.rs"]
mod targets;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

/// The files of `dir`, sorted; none when it does not exist.
fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_seed_and_reproducer_passes_its_fuzz_target() {
    let root = fuzz_dir();
    let mut failures = Vec::new();
    for (name, run) in targets::TARGETS {
        let seeds = inputs(&root.join("corpus-seeds").join(name));
        assert!(
            seeds.len() >= 5,
            "fuzz/corpus-seeds/{name}/ holds {} seeds",
            seeds.len()
        );
        let found = inputs(&root.join("artifacts").join(name));
        for path in seeds.iter().chain(&found) {
            let data = std::fs::read(path).unwrap();
            if catch_unwind(AssertUnwindSafe(|| run(&data))).is_err() {
                failures.push(path.display().to_string());
            }
        }
        eprintln!(
            "{name}: {} seeds and {} local artifacts replayed",
            seeds.len(),
            found.len()
        );
    }
    assert!(failures.is_empty(), "inputs that panicked: {failures:#?}");
}

/// Every cargo-fuzz target has its seeds and its body in `fuzz/src/lib.rs`: a target added
/// without them would not be replayed.
#[test]
fn every_fuzz_target_is_replayed() {
    let mut on_disk: Vec<String> = inputs(&fuzz_dir().join("fuzz_targets"))
        .iter()
        .filter_map(|p| Some(p.file_stem()?.to_str()?.to_string()))
        .collect();
    on_disk.sort();
    let mut replayed: Vec<String> = targets::TARGETS
        .iter()
        .map(|(n, _)| n.to_string())
        .collect();
    replayed.sort();
    assert_eq!(on_disk, replayed);
}
