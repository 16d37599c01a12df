//! Builds the tc datapath (bpf/agent.bpf.c) and the per-node CPU accounting
//! (bpf/cpu_acct.bpf.c) with libbpf-cargo's skeleton builder. CO-RE:
//! vmlinux.h is generated from the running kernel's BTF into OUT_DIR, never committed.
//! The packet parser is the flow probe's (telemetry/bpf/include/parse/), shared so that both
//! datapaths read the same frames the same way.

use std::path::{Path, PathBuf};
use std::process::Command;

use libbpf_cargo::SkeletonBuilder;

const SRC: &str = "bpf/agent.bpf.c";
const CPU_ACCT: &str = "bpf/cpu_acct.bpf.c";
/// Headers shared with the flow probe (the parser, enum cgloop_stat).
const SHARED_INCLUDE: &str = "../../telemetry/bpf/include";

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let btf = std::env::var("CGLOOP_VMLINUX_BTF").unwrap_or_else(|_| "/sys/kernel/btf/vmlinux".into());
    let vmlinux = Command::new("bpftool")
        .args(["btf", "dump", "file", &btf, "format", "c"])
        .output()
        .unwrap_or_else(|e| panic!("running bpftool (scripts/bootstrap.d/node-agent.apt) failed: {e}"));
    if !vmlinux.status.success() {
        panic!("bpftool btf dump {btf}: {}", String::from_utf8_lossy(&vmlinux.stderr));
    }
    std::fs::write(out.join("vmlinux.h"), &vmlinux.stdout).expect("write vmlinux.h");

    SkeletonBuilder::new()
        .source(SRC)
        .clang_args([
            "-I".to_string(),
            out.display().to_string(),
            "-I".to_string(),
            "bpf".to_string(),
            "-I".to_string(),
            SHARED_INCLUDE.to_string(),
            "-Wall".to_string(),
        ])
        .build_and_generate(out.join("agent.skel.rs"))
        .expect("building bpf/agent.bpf.c");
    SkeletonBuilder::new()
        .source(CPU_ACCT)
        .clang_args(["-I".to_string(), out.display().to_string(), "-Wall".to_string()])
        .build_and_generate(out.join("cpu_acct.skel.rs"))
        .expect("building bpf/cpu_acct.bpf.c");
    println!("cargo:rerun-if-changed={SRC}");
    println!("cargo:rerun-if-changed={CPU_ACCT}");
    println!("cargo:rerun-if-changed=bpf/agent.h");
    println!("cargo:rerun-if-changed=bpf/qmon.bpf.h");
    println!("cargo:rerun-if-changed=bpf/qprot.bpf.h");
    println!("cargo:rerun-if-changed=bpf/int.bpf.h");
    rerun_if_changed_under(Path::new(SHARED_INCLUDE));
    println!("cargo:rerun-if-env-changed=CGLOOP_VMLINUX_BTF");
}

/// Every header under `dir` (cargo watches files, and a directory only for its own entries).
fn rerun_if_changed_under(dir: &Path) {
    println!("cargo:rerun-if-changed={}", dir.display());
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rerun_if_changed_under(&path);
        } else {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
}
