//! Writes and re-encodes the cross-language test vectors (tests/test_contract_vectors.py).
//!
//!   cgloop-vectors emit DIR          write DIR/<name>.bin for every canonical sample
//!   cgloop-vectors reencode DIR OUT  decode each DIR/<name>.bin with its type, write OUT/<name>.bin
//!   cgloop-vectors bus-table         print the bus table (proto/cgloop/v1/bus.proto) as Rust
//!                                    reads it, as JSON (tests/test_bus_table.py)
//!   cgloop-vectors ops-table         print the daemons' metrics ports (proto/cgloop/v1/ops.proto)
//!                                    as Rust reads them, as JSON (tests/test_ops_table.py)
//!   cgloop-vectors chain-catalogue   print the chain-function catalogue (node_agent.proto) as
//!                                    Rust reads it, as JSON (tests/test_chain_catalogue.py)

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use cgloop_proto::vectors::{Vector, VECTORS};

const USAGE: &str = "usage: cgloop-vectors emit DIR | cgloop-vectors reencode DIR OUT | \
                     cgloop-vectors bus-table | cgloop-vectors ops-table | \
                     cgloop-vectors chain-catalogue";

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("cgloop-vectors: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Vec<String>) -> Result<()> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        ["emit", dir] => emit(Path::new(dir)),
        ["reencode", dir, out] => reencode_all(Path::new(dir), Path::new(out)),
        ["bus-table"] => {
            println!("{}", cgloop_proto::bus::table_json());
            Ok(())
        }
        ["ops-table"] => {
            println!("{}", cgloop_proto::ops::table_json());
            Ok(())
        }
        ["chain-catalogue"] => {
            println!("{}", cgloop_proto::catalogue::table_json());
            Ok(())
        }
        _ => bail!("{USAGE}"),
    }
}

fn vector_file(dir: &Path, vector: &Vector) -> PathBuf {
    dir.join(format!("{}.bin", vector.name))
}

fn emit(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for vector in VECTORS {
        let path = vector_file(dir, vector);
        std::fs::write(&path, (vector.sample_bytes)())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Every vector file must be present: a missing one would otherwise pass silently.
fn reencode_all(dir: &Path, out: &Path) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    for vector in VECTORS {
        let input = vector_file(dir, vector);
        let bytes =
            std::fs::read(&input).with_context(|| format!("reading {}", input.display()))?;
        let encoded = (vector.reencode)(&bytes)
            .with_context(|| format!("decoding {} as {}", input.display(), vector.message))?;
        let output = vector_file(out, vector);
        std::fs::write(&output, encoded)
            .with_context(|| format!("writing {}", output.display()))?;
    }
    Ok(())
}
