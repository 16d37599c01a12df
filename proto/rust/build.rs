//! Generates the prost messages and the NodeAgentService client/server from ../cgloop/v1.
//! Output goes to OUT_DIR only; nothing generated is committed.

use std::path::{Path, PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let include_root = Path::new("..");
    let proto_dir = include_root.join("cgloop").join("v1");

    let mut protos: Vec<PathBuf> = std::fs::read_dir(&proto_dir)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "proto"))
        .collect();
    protos.sort(); // stable generated code regardless of directory order

    // A new .proto file must trigger a rebuild too, not only edits to known ones.
    println!("cargo:rerun-if-changed={}", proto_dir.display());

    tonic_prost_build::configure()
        // BTreeMap encodes map entries sorted by key, as protobuf-python does with
        // deterministic=True: the bytes are identical in both languages.
        .btree_map(".")
        .build_client(true)
        .build_server(true)
        .compile_protos(&protos, &[include_root.to_path_buf()])?;
    Ok(())
}
