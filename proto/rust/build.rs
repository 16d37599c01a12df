//! Generates the prost messages and the NodeAgentService client/server from ../cgloop/v1, and
//! the chain-function catalogue table (`chain_catalogue.rs`, see src/catalogue.rs) from the
//! options declared on the function messages of node_agent.proto.
//! Output goes to OUT_DIR only; nothing generated is committed.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let include_root = Path::new("..");
    let proto_dir = include_root.join("cgloop").join("v1");
    let out = PathBuf::from(std::env::var("OUT_DIR")?);

    let mut protos: Vec<PathBuf> = std::fs::read_dir(&proto_dir)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "proto"))
        .collect();
    protos.sort(); // stable generated code regardless of directory order

    // A new .proto file must trigger a rebuild too, not only edits to known ones.
    println!("cargo:rerun-if-changed={}", proto_dir.display());

    let descriptors = out.join("cgloop_descriptors.bin");
    tonic_prost_build::configure()
        // BTreeMap encodes map entries sorted by key, as protobuf-python does with
        // deterministic=True: the bytes are identical in both languages.
        .btree_map(".")
        .build_client(true)
        .build_server(true)
        .file_descriptor_set_path(&descriptors)
        .compile_protos(&protos, &[include_root.to_path_buf()])?;

    let set = desc::FileDescriptorSet::decode(std::fs::read(&descriptors)?.as_slice())?;
    std::fs::write(out.join("chain_catalogue.rs"), catalogue(&set)?)?;
    Ok(())
}

/// The table of chain functions: every member of `cgloop.v1.ChainFunction.function`, its
/// FunctionTraits and every parameter's ParamRule, as Rust statics.
fn catalogue(set: &desc::FileDescriptorSet) -> Result<String, String> {
    let messages: Vec<&desc::Descriptor> = set
        .file
        .iter()
        .filter(|f| f.package == "cgloop.v1")
        .flat_map(|f| f.message_type.iter())
        .collect();
    let find = |name: &str| messages.iter().copied().find(|m| m.name == name);
    let chain = find("ChainFunction").ok_or("no message cgloop.v1.ChainFunction")?;
    let oneof = chain
        .oneof_decl
        .iter()
        .position(|o| o.name == "function")
        .ok_or("ChainFunction has no oneof `function`")? as i32;
    let mut table = String::from("pub static FUNCTIONS: &[FunctionSpec] = &[\n");
    let mut arms = String::new();
    let members = chain.field.iter().filter(|f| f.oneof_index == Some(oneof));
    for (index, member) in members.enumerate() {
        let type_name = member.type_name.rsplit('.').next().unwrap_or_default();
        let msg = find(type_name).ok_or(format!("no message {type_name}"))?;
        let traits = msg
            .options
            .as_ref()
            .and_then(|o| o.function_traits.clone())
            .ok_or(format!("function message {type_name} declares no function_traits"))?;
        let mut params = String::new();
        for p in &msg.field {
            let rule = p.options.as_ref().and_then(|o| o.param_rule.clone()).unwrap_or_default();
            let ty = match p.r#type {
                4 | 13 => "Uint",
                9 => "Str",
                11 => "Message",
                8 => "Bool",
                other => return Err(format!("{type_name}.{}: parameter type {other} unsupported", p.name)),
            };
            let oneof = match (p.oneof_index, p.proto3_optional.unwrap_or(false)) {
                (Some(i), false) => format!("Some({:?})", msg.oneof_decl[i as usize].name),
                _ => "None".into(),
            };
            let optional = p.oneof_index.is_some();
            let _ = writeln!(
                params,
                "        Param {{ name: {:?}, number: {}, ty: ParamType::{ty}, optional: {optional}, \
                 oneof: {oneof}, min: {:?}, max: {:?}, interface: {}, rate: {} }},",
                p.name, p.number, rule.min, rule.max, rule.interface, rule.rate
            );
        }
        let mut oneofs: Vec<String> = Vec::new();
        for p in msg.field.iter().filter(|p| !p.proto3_optional.unwrap_or(false)) {
            if let Some(i) = p.oneof_index {
                let n = format!("{:?}", msg.oneof_decl[i as usize].name);
                if !oneofs.contains(&n) {
                    oneofs.push(n);
                }
            }
        }
        let variant = camel(&member.name);
        let _ = writeln!(
            table,
            "    FunctionSpec {{ name: {:?}, number: {}, message: {:?}, kind: {}, bound: {}, \
             needs_a_parameter: {}, oneofs: &[{}], params: &[\n{params}    ] }},",
            member.name,
            member.number,
            type_name,
            kind(traits.kind)?,
            bound(traits.bound)?,
            traits.needs_a_parameter,
            oneofs.join(", "),
        );
        let _ = writeln!(arms, "        Function::{variant}(m) => (&FUNCTIONS[{index}], m.encode_to_vec()),");
    }
    table.push_str("];\n");
    Ok(format!(
        "// Generated by proto/rust/build.rs from cgloop/v1/node_agent.proto.\n{table}\n\
         /// The catalogue entry of a function and its parameters encoded.\n\
         pub(crate) fn lookup(f: &Function) -> (&'static FunctionSpec, Vec<u8>) {{\n    \
         match f {{\n{arms}    }}\n}}\n"
    ))
}

fn kind(k: i32) -> Result<&'static str, String> {
    Ok(match k {
        1 => "FunctionKind::Elementary",
        2 => "FunctionKind::Basic",
        3 => "FunctionKind::Advanced",
        other => return Err(format!("function_traits.kind {other} is not a placement")),
    })
}

fn bound(b: i32) -> Result<&'static str, String> {
    Ok(match b {
        1 => "FunctionBound::Io",
        2 => "FunctionBound::Cpu",
        other => return Err(format!("function_traits.bound {other} is not a category")),
    })
}

/// prost's name for a oneof member's variant ("rate_limit" -> "RateLimit").
fn camel(s: &str) -> String {
    s.split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next().map(|f| f.to_ascii_uppercase().to_string() + c.as_str()).unwrap_or_default()
        })
        .collect()
}

/// The few descriptor.proto fields the catalogue needs, with the custom options the generic
/// prost_types descriptors would drop as unknown fields.
mod desc {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct FileDescriptorSet {
        #[prost(message, repeated, tag = "1")]
        pub file: Vec<FileDescriptor>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct FileDescriptor {
        #[prost(string, tag = "2")]
        pub package: String,
        #[prost(message, repeated, tag = "4")]
        pub message_type: Vec<Descriptor>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Descriptor {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(message, repeated, tag = "2")]
        pub field: Vec<Field>,
        #[prost(message, optional, tag = "7")]
        pub options: Option<MessageOptions>,
        #[prost(message, repeated, tag = "8")]
        pub oneof_decl: Vec<Oneof>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Field {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(int32, tag = "3")]
        pub number: i32,
        #[prost(int32, tag = "5")]
        pub r#type: i32,
        #[prost(string, tag = "6")]
        pub type_name: String,
        #[prost(message, optional, tag = "8")]
        pub options: Option<FieldOptions>,
        #[prost(int32, optional, tag = "9")]
        pub oneof_index: Option<i32>,
        #[prost(bool, optional, tag = "17")]
        pub proto3_optional: Option<bool>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Oneof {
        #[prost(string, tag = "1")]
        pub name: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct MessageOptions {
        #[prost(message, optional, tag = "50301")]
        pub function_traits: Option<FunctionTraits>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct FunctionTraits {
        #[prost(int32, tag = "1")]
        pub kind: i32,
        #[prost(int32, tag = "2")]
        pub bound: i32,
        #[prost(bool, tag = "3")]
        pub needs_a_parameter: bool,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct FieldOptions {
        #[prost(message, optional, tag = "50302")]
        pub param_rule: Option<ParamRule>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ParamRule {
        #[prost(uint64, optional, tag = "1")]
        pub min: Option<u64>,
        #[prost(uint64, optional, tag = "2")]
        pub max: Option<u64>,
        #[prost(bool, tag = "3")]
        pub interface: bool,
        #[prost(bool, tag = "4")]
        pub rate: bool,
    }
}
