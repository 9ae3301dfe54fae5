//! CI check: every kernel compiles with NVRTC (no GPU needed). Where libnvrtc is absent the
//! test says so and passes, unless SGL_REQUIRE_NVRTC=1 (set in CI after installing
//! nvidia-cuda-nvrtc), which makes a missing NVRTC a failure. With `SGL_PTXAS` (a ptxas binary,
//! from PyPI's nvidia-cuda-nvcc in CI) the sm_90 PTX is also assembled, and no kernel may spill
//! registers to local memory: a kernel edit that blows up its registers fails here, not first on
//! a GPU.

#[test]
fn every_kernel_compiles_with_nvrtc() {
    if !sgl_kernels::nvrtc_available() {
        assert!(
            std::env::var("SGL_REQUIRE_NVRTC").as_deref() != Ok("1"),
            "SGL_REQUIRE_NVRTC=1 but libnvrtc was not found (LD_LIBRARY_PATH?)"
        );
        eprintln!("libnvrtc not found: kernel compilation NOT checked");
        return;
    }
    for arch in ["compute_80", "compute_90"] {
        let ptx = match sgl_kernels::compile_ptx(arch) {
            Ok(p) => p,
            Err(e) => panic!("{arch}: {e}"),
        };
        for name in sgl_kernels::KERNEL_NAMES {
            assert!(
                ptx.contains(&format!(".entry {name}(")),
                "{arch}: no entry point {name}"
            );
        }
        // tensor-core and ldmatrix paths really made it into the PTX
        assert!(
            ptx.contains("mma.sync.aligned.m16n8k16"),
            "{arch}: no mma.sync"
        );
        assert!(ptx.contains("ldmatrix.sync.aligned"), "{arch}: no ldmatrix");
        // programmatic dependent launch: from sm_90 every kernel waits for its predecessors
        // (the launchers launch them all with PDL there); before sm_90 the PTX has none of it
        for name in sgl_kernels::KERNEL_NAMES {
            let body = entry_body(&ptx, name);
            let waits = body.contains("griddepcontrol.wait;");
            if arch == "compute_90" {
                assert!(waits, "{arch}: {name} has no griddepcontrol.wait");
                assert!(
                    body.contains("griddepcontrol.launch_dependents;"),
                    "{arch}: {name} never lets its dependents launch"
                );
            } else {
                assert!(
                    !body.contains("griddepcontrol"),
                    "{arch}: {name} has PDL code"
                );
            }
        }
    }
}

/// The PTX of entry `name`: from its `.entry` line to the next entry (or the end).
fn entry_body<'a>(ptx: &'a str, name: &str) -> &'a str {
    let start = ptx
        .find(&format!(".entry {name}("))
        .unwrap_or_else(|| panic!("no entry point {name}"));
    let rest = &ptx[start + 1..];
    let end = rest.find(".entry ").map_or(ptx.len(), |e| start + 1 + e);
    &ptx[start..end]
}

/// Every kernel assembled for sm_90 by `SGL_PTXAS`: no spill stores or loads.
/// Prints each entry's registers and shared memory (what decides the blocks a multiprocessor
/// holds). Skipped without `SGL_PTXAS` or NVRTC.
#[test]
fn every_kernel_assembles_without_spills() {
    let Ok(ptxas) = std::env::var("SGL_PTXAS") else {
        eprintln!("SGL_PTXAS not set: register use NOT checked");
        return;
    };
    if !sgl_kernels::nvrtc_available() {
        assert!(
            std::env::var("SGL_REQUIRE_NVRTC").as_deref() != Ok("1"),
            "SGL_REQUIRE_NVRTC=1 but libnvrtc was not found (LD_LIBRARY_PATH?)"
        );
        return;
    }
    let ptx = sgl_kernels::compile_ptx("compute_90").unwrap_or_else(|e| panic!("compute_90: {e}"));
    let dir = std::env::temp_dir().join(format!("sgl-ptxas-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let src = dir.join("kernels.ptx");
    std::fs::write(&src, &ptx).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
    let out = std::process::Command::new(&ptxas)
        .args(["-arch=sm_90", "-v", "-o"])
        .arg(dir.join("kernels.cubin"))
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("{ptxas}: {e}"));
    let _ = std::fs::remove_dir_all(&dir);
    let log =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "ptxas failed:\n{log}");
    // ptxas -v: "Compiling entry function 'NAME'", then the stack and spill line, then "Used
    // N registers, ..."
    let mut entry = String::new();
    let mut seen = 0;
    let mut spilled = Vec::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            entry = rest.split('\'').next().unwrap_or_default().to_string();
            seen += 1;
        } else if line.contains("spill stores") {
            // a stack frame alone is a local array the kernel indexes (the all-reduce's peer
            // table), not a spill
            let bytes = |what: &str| {
                line.split(',')
                    .find(|p| p.contains(what))
                    .and_then(|p| p.split_whitespace().next())
                    .and_then(|n| n.parse::<u64>().ok())
            };
            match (bytes("spill stores"), bytes("spill loads")) {
                (Some(0), Some(0)) => {}
                _ => spilled.push(format!("{entry}: {}", line.trim())),
            }
        } else if line.contains("Used ") && line.contains("registers") {
            println!(
                "{entry}: {}",
                line.split("info    : ").nth(1).unwrap_or(line).trim()
            );
        }
    }
    assert_eq!(
        seen,
        sgl_kernels::KERNEL_NAMES.len(),
        "ptxas compiled {seen} entries, KERNEL_NAMES has {}",
        sgl_kernels::KERNEL_NAMES.len()
    );
    assert!(
        spilled.is_empty(),
        "kernels that spill:\n{}",
        spilled.join("\n")
    );
}
