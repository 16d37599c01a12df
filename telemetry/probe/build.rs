//! Compiles telemetry/bpf/flow_probe.bpf.c with clang and generates its libbpf-rs skeleton.
//! vmlinux.h (CO-RE type definitions) is dumped from the build machine's kernel BTF with bpftool
//! into OUT_DIR: it is 3 MB and machine-derived, so it is not checked in.
use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use libbpf_cargo::SkeletonBuilder;

const BTF: &str = "/sys/kernel/btf/vmlinux";

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let bpf_dir = manifest.join("../bpf");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets it"));
    let vmlinux = out.join("vmlinux.h");
    if !vmlinux.exists() {
        dump_vmlinux(&vmlinux);
    }
    let src = bpf_dir.join("flow_probe.bpf.c");
    SkeletonBuilder::new()
        .source(&src)
        .clang_args([
            "-O2".into(),
            "-g".into(),
            "-D__TARGET_ARCH_x86".into(),
            format!("-I{}", out.display()),
            format!("-I{}", bpf_dir.join("include").display()),
        ])
        .build_and_generate(out.join("flow_probe.skel.rs"))
        .unwrap_or_else(|e| panic!("building {}: {e:#}", src.display()));
    println!("cargo:rerun-if-changed={}", bpf_dir.display());
    for entry in fs::read_dir(bpf_dir.join("include"))
        .into_iter()
        .flatten()
        .flatten()
    {
        println!("cargo:rerun-if-changed={}", entry.path().display());
    }
}

fn dump_vmlinux(dst: &Path) {
    if !Path::new(BTF).exists() {
        panic!("{BTF} missing: building the probe needs a kernel with CONFIG_DEBUG_INFO_BTF=y");
    }
    let output = Command::new("bpftool")
        .args(["btf", "dump", "file", BTF, "format", "c"])
        .output()
        .unwrap_or_else(|e| panic!("running bpftool (Debian package bpftool): {e}"));
    if !output.status.success() {
        panic!(
            "bpftool btf dump failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    fs::write(dst, output.stdout).unwrap_or_else(|e| panic!("writing {}: {e}", dst.display()));
}
