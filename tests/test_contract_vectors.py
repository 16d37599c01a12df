"""Cross-language wire compatibility of cgloop's contracts (proto/cgloop/v1).

The Rust crate cgloop-proto (prost) and the Python bindings (protobuf-python) must agree byte
for byte on the canonical samples (proto/rust/src/samples.rs, cgloop.contracts.samples): Rust
producers and Python consumers share Kafka topics, and byte identity also proves both sides
encode every field the same way. Golden files guard against accidental wire changes.
"""

import importlib
import json
import os
import pkgutil
import shutil
import subprocess
from pathlib import Path

import pytest
from cgloop.contracts import SCHEMA_VERSION
from cgloop.contracts.samples import SAMPLES
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

REPO = Path(__file__).resolve().parents[1]
GOLDEN_DIR = REPO / "proto" / "testdata" / "vectors"
NAMES = sorted(SAMPLES)
# A garbage buffer: field 1 of length 64 followed by 3 bytes, so every message type rejects it.
GARBAGE = bytes([0x0A, 0x40, 0x01, 0x02, 0x03])


def _cargo() -> str | None:
    return shutil.which("cargo") or shutil.which(str(Path.home() / ".cargo" / "bin" / "cargo"))


@pytest.fixture(scope="module")
def vectors_tool() -> Path:
    """Builds cgloop-vectors and returns its path (asked from cargo: target dirs vary)."""
    cargo = _cargo()
    if cargo is None:
        pytest.skip("cargo is not installed: the Rust side cannot be checked")
    build = subprocess.run(
        [
            cargo,
            "build",
            "-q",
            "-p",
            "cgloop-proto",
            "--bin",
            "cgloop-vectors",
            "--message-format=json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert build.returncode == 0, f"cargo build failed:\n{build.stderr}"
    for line in build.stdout.splitlines():
        message = json.loads(line)
        if message.get("executable") and message["target"]["name"] == "cgloop-vectors":
            return Path(message["executable"])
    raise AssertionError("cargo did not report the cgloop-vectors executable")


def _run(tool: Path, *args: str | os.PathLike[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(tool), *map(str, args)], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture(scope="module")
def rust_dir(vectors_tool: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rust-emitted")
    result = _run(vectors_tool, "emit", out)
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="module")
def python_roundtrip_dir(vectors_tool: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Python-encoded samples, decoded and re-encoded by Rust."""
    source = tmp_path_factory.mktemp("python-emitted")
    for name, sample in SAMPLES.items():
        (source / f"{name}.bin").write_bytes(_encode(sample()))
    out = tmp_path_factory.mktemp("rust-reencoded")
    result = _run(vectors_tool, "reencode", source, out)
    assert result.returncode == 0, result.stderr
    return out


def _encode(message: Message) -> bytes:
    # deterministic=True sorts map entries by key, as the Rust side's BTreeMap does.
    return message.SerializeToString(deterministic=True)


def _parse_like(sample: Message, data: bytes) -> Message:
    parsed = type(sample)()
    parsed.ParseFromString(data)
    return parsed


def test_rust_and_python_have_the_same_samples(rust_dir: Path) -> None:
    assert sorted(path.stem for path in rust_dir.glob("*.bin")) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_rust_bytes_equal_python_bytes(name: str, rust_dir: Path) -> None:
    rust_bytes = (rust_dir / f"{name}.bin").read_bytes()
    assert rust_bytes == _encode(SAMPLES[name]())


@pytest.mark.parametrize("name", NAMES)
def test_python_parses_rust_bytes_into_the_sample(name: str, rust_dir: Path) -> None:
    sample = SAMPLES[name]()
    assert _parse_like(sample, (rust_dir / f"{name}.bin").read_bytes()) == sample


@pytest.mark.parametrize("name", NAMES)
def test_rust_reencodes_python_bytes_identically(name: str, python_roundtrip_dir: Path) -> None:
    assert (python_roundtrip_dir / f"{name}.bin").read_bytes() == _encode(SAMPLES[name]())


@pytest.mark.parametrize("name", NAMES)
def test_golden_vectors_still_decode_to_the_samples(name: str) -> None:
    """Fails on a wire-incompatible change; see proto/testdata/vectors/README.md."""
    sample = SAMPLES[name]()
    golden = (GOLDEN_DIR / f"{name}.bin").read_bytes()
    assert _parse_like(sample, golden) == sample


def _covered_fields(message: Message, covered: set[str], reached: set[str]) -> None:
    """Records which fields of which message types are set (non-default) anywhere in message."""
    reached.add(message.DESCRIPTOR.full_name)
    for field, value in message.ListFields():
        key = f"{message.DESCRIPTOR.full_name}.{field.name}"
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            if len(value) >= 2:  # maps need several entries to show their order on the wire
                covered.add(key)
            continue
        covered.add(key)
        if field.type != FieldDescriptor.TYPE_MESSAGE:
            continue
        children = value if field.is_repeated else [value]
        for child in children:
            _covered_fields(child, covered, reached)


@pytest.mark.parametrize("name", NAMES)
def test_samples_set_every_field(name: str) -> None:
    """Every field of every message type in a sample, every oneof variant included, is set."""
    covered: set[str] = set()
    reached: set[str] = set()
    sample = SAMPLES[name]()
    _covered_fields(sample, covered, reached)
    pool = sample.DESCRIPTOR.file.pool
    missing = [
        f"{type_name}.{field.name}"
        for type_name in sorted(reached)
        for field in pool.FindMessageTypeByName(type_name).fields
        if f"{type_name}.{field.name}" not in covered
    ]
    assert not missing, f"fields left at their default in {name}: {missing}"


def _nested_messages(message: Message) -> list[Message]:
    """message and every message inside it, depth first."""
    found = [message]
    for field, value in message.ListFields():
        if (
            field.type == FieldDescriptor.TYPE_MESSAGE
            and not field.message_type.GetOptions().map_entry
        ):
            for child in value if field.is_repeated else [value]:
                found.extend(_nested_messages(child))
    return found


@pytest.mark.parametrize("name", NAMES)
def test_samples_carry_the_schema_version(name: str) -> None:
    headers = [
        message
        for message in _nested_messages(SAMPLES[name]())
        if message.DESCRIPTOR.full_name == "cgloop.v1.RecordHeader"
    ]
    assert headers, f"{name} has no RecordHeader"
    assert {header.schema_version for header in headers} == {SCHEMA_VERSION}


@pytest.mark.parametrize("name", NAMES)
def test_python_rejects_truncated_and_garbage_buffers(name: str) -> None:
    sample = SAMPLES[name]()
    # Dropping the last byte always cuts the last field short, whatever its wire type.
    for bad in (_encode(sample)[:-1], GARBAGE, b"\xff" * 16):
        with pytest.raises(DecodeError):
            _parse_like(sample, bad)


def _all_message_types() -> list[Descriptor]:
    import cgloop.v1

    found: list[Descriptor] = []
    pending: list[Descriptor] = []
    for module_info in pkgutil.iter_modules(cgloop.v1.__path__):
        if module_info.name.endswith("_pb2"):
            module = importlib.import_module(f"cgloop.v1.{module_info.name}")
            pending.extend(module.DESCRIPTOR.message_types_by_name.values())
    while pending:
        message = pending.pop()
        if not message.GetOptions().map_entry:
            found.append(message)
        pending.extend(message.nested_types)
    return found


def _is_real_oneof_member(field: FieldDescriptor) -> bool:
    # A proto3 `optional` field sits alone in a synthetic oneof named after it.
    oneof = field.containing_oneof
    return oneof is not None and oneof.name != f"_{field.name}"


def test_every_message_keeps_the_field_order_rules() -> None:
    """The wire rules of common.proto that keep prost and protobuf-python bytes identical, for
    every message, including those without a sample (node_agent.proto)."""
    messages = _all_message_types()
    assert len(messages) > 50
    broken = []
    for message in messages:
        numbers = [field.number for field in message.fields]
        if numbers != sorted(numbers):
            broken.append(f"{message.full_name}: fields not declared in field-number order")
        for oneof in message.oneofs:
            members = {f.number for f in oneof.fields if _is_real_oneof_member(f)}
            if not members:
                continue
            inside = [
                f.name
                for f in message.fields
                if f.number not in members and min(members) < f.number < max(members)
            ]
            if inside:
                broken.append(
                    f"{message.full_name}: {inside} numbered inside oneof {oneof.name}'s range"
                )
    assert not broken, broken


def test_reencode_fails_loudly_on_garbage(vectors_tool: Path, tmp_path: Path) -> None:
    source, out = tmp_path / "in", tmp_path / "out"
    source.mkdir()
    for name in NAMES:
        (source / f"{name}.bin").write_bytes(GARBAGE)
    result = _run(vectors_tool, "reencode", source, out)
    assert result.returncode != 0
    # The message names the file and the message type it failed to decode as.
    assert "decoding" in result.stderr and "cgloop.v1." in result.stderr
    assert any(f"{name}.bin" in result.stderr for name in NAMES)
    assert "panicked" not in result.stderr


def test_reencode_fails_loudly_on_a_missing_file(vectors_tool: Path, tmp_path: Path) -> None:
    result = _run(vectors_tool, "reencode", tmp_path / "absent", tmp_path / "out")
    assert result.returncode != 0
    assert "reading" in result.stderr and "absent" in result.stderr


def test_vectors_tool_explains_its_usage(vectors_tool: Path) -> None:
    result = _run(vectors_tool, "frobnicate")
    assert result.returncode != 0
    assert "usage:" in result.stderr
