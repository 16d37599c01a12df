"""Deployment files: docker-compose.yml, the Dockerfile and the config files compose mounts.

No Docker engine runs on our machines, so the compose file is checked by compose-go, the Go
library behind `docker compose config` (Compose Specification JSON schema, interpolation,
normalisation, consistency of depends_on/volumes/networks). tests/compose/validate/ is a tiny
program around it; it is built once into .cache/compose-validate/ (Go's build cache keeps later
builds under a second). Go and its module proxy are required: without them these tests fail,
they do not skip.
"""

from __future__ import annotations

import base64
import fnmatch
import importlib
import ipaddress
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
DEPLOY = REPO / "deploy"
VALIDATOR_SRC = REPO / "tests" / "compose" / "validate"
VALIDATOR_BIN = REPO / ".cache" / "compose-validate" / "composevalidate"
GO_BUILD_TIMEOUT_S = 900

INFRASTRUCTURE = {"kafka", "clickhouse", "grafana", "prometheus", "onos"}
DAEMONS = {"probe", "int-collector", "sink", "analytics", "policy-engine", "node-agent"}
# One-shot services of the loop profile: they run to completion before the daemons start.
INIT = {"node-agent-certs"}
LOOP = DAEMONS | INIT
# `cgloop` commands that hand their unparsed options on to a Rust program (and its subcommand).
WRAPPERS = {
    ("telemetry", "probe"): ("cgloop-probe", "run"),
    ("telemetry", "int-collector"): ("cgloop-int-collector", "run"),
}
# What the node agent (--tls-dir) and the policy engine (--agent-tls-dir) read there.
AGENT_TLS_FILES = {"ca.pem", "server.pem", "server.key"}
ENGINE_TLS_FILES = {"ca.pem", "client.pem", "client.key"}
HOST_NETWORK = {"probe", "node-agent"}
# Bind mounts from outside the repository: host kernel interfaces only, each one deliberate.
HOST_PATHS = {"/sys/fs/bpf", "/sys/kernel/btf"}
IMAGE_SERIES = {
    "kafka": ("apache/kafka", "4.1."),
    "clickhouse": ("clickhouse/clickhouse-server", "26."),
    "grafana": ("grafana/grafana", "12."),
    "prometheus": ("prom/prometheus", "v3."),
    "onos": ("onosproject/onos", "2.7."),
}
CLICKHOUSE_PORTS = {"native": 9000, "http": 8123}
GRAFANA_PLUGIN_VARS = ("GF_PLUGINS_PREINSTALL_SYNC", "GF_PLUGINS_PREINSTALL", "GF_INSTALL_PLUGINS")

Project = dict[str, Any]
Service = dict[str, Any]


# ----------------------------------------------------------------------------- validator -------


@pytest.fixture(scope="session")
def validator() -> Path:
    """Build the compose-go validator (cached by Go's build cache) and return its path."""
    go = shutil.which("go")
    if go is None:
        pytest.fail(
            "Go is required to validate docker-compose.yml with compose-go "
            "(install Go >= 1.24; scripts/bootstrap.sh on CI machines)",
            pytrace=False,
        )
    VALIDATOR_BIN.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    # go.sum is committed: never rewrite it, and never build without VCS info problems.
    env["GOFLAGS"] = " ".join(
        f for f in (env.get("GOFLAGS", ""), "-mod=readonly", "-buildvcs=false") if f
    )
    try:
        build = subprocess.run(
            [go, "build", "-o", str(VALIDATOR_BIN), "."],
            cwd=VALIDATOR_SRC,
            env=env,
            capture_output=True,
            text=True,
            timeout=GO_BUILD_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"`go build` of {VALIDATOR_SRC.relative_to(REPO)} took over {GO_BUILD_TIMEOUT_S} s: "
            "is the Go module proxy reachable?",
            pytrace=False,
        )
    if build.returncode != 0:
        pytest.fail(
            f"cannot build the compose validator in {VALIDATOR_SRC.relative_to(REPO)} "
            "(needs Go >= 1.24 and the Go module proxy for github.com/compose-spec/compose-go/v2):"
            f"\n{build.stderr.strip()}",
            pytrace=False,
        )
    return VALIDATOR_BIN


def run_validator(
    binary: Path, compose_file: Path, *, profiles: str = "*"
) -> subprocess.CompletedProcess[str]:
    """Load `compose_file` as `docker compose config` would, relative to the repository root,
    with an empty environment (so every `${VAR:-default}` takes its default)."""
    return subprocess.run(
        [str(binary), "-f", str(compose_file), "-workdir", str(REPO), "-profiles", profiles],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ.get("PATH", "")},
    )


@pytest.fixture(scope="session")
def project(validator: Path) -> Project:
    """The normalised project, every profile enabled."""
    result = run_validator(validator, COMPOSE_FILE)
    assert result.returncode == 0, f"docker-compose.yml is not valid:\n{result.stderr}"
    loaded: Project = json.loads(result.stdout)
    return loaded


@pytest.fixture(scope="session")
def raw_compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return loaded


def service(project: Project, name: str) -> Service:
    assert name in project["services"], f"docker-compose.yml has no service {name!r}"
    svc: Service = project["services"][name]
    return svc


def bind_mounts(svc: Service) -> Iterator[dict[str, Any]]:
    for volume in svc.get("volumes") or []:
        if volume.get("type") == "bind":
            yield volume


def published_targets(svc: Service) -> set[int]:
    return {int(p["target"]) for p in svc.get("ports") or []}


# ------------------------------------------------------------------------ the spec itself ------


def test_compose_file_loads_per_compose_spec(project: Project) -> None:
    assert project["name"] == "cgloop"
    assert set(project["services"]) == INFRASTRUCTURE | LOOP
    assert {"kafka-data", "clickhouse-data", "grafana-data", "cgloop-certs"} <= set(
        project["volumes"]
    )


def test_default_profile_starts_infrastructure_only(validator: Path) -> None:
    result = run_validator(validator, COMPOSE_FILE, profiles="")
    assert result.returncode == 0, result.stderr
    assert set(json.loads(result.stdout)["services"]) == INFRASTRUCTURE


def _set_kafka_ports_to_scalar(doc: dict[str, Any]) -> None:
    doc["services"]["kafka"]["ports"] = 5


def _add_unknown_top_level_key(doc: dict[str, Any]) -> None:
    doc["bogus_top_level"] = {"a": 1}


def _depend_on_missing_service(doc: dict[str, Any]) -> None:
    doc["services"]["sink"]["depends_on"] = {"nosuchservice": {"condition": "service_healthy"}}


def _use_undeclared_volume(doc: dict[str, Any]) -> None:
    doc["services"]["analytics"]["volumes"] = ["undeclared-volume:/data"]


def _bad_healthcheck_interval(doc: dict[str, Any]) -> None:
    doc["services"]["kafka"]["healthcheck"]["interval"] = "often"


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (_set_kafka_ports_to_scalar, "services.kafka.ports"),
        (_add_unknown_top_level_key, "bogus_top_level"),
        (_depend_on_missing_service, "nosuchservice"),
        (_use_undeclared_volume, "undeclared-volume"),
        (_bad_healthcheck_interval, "interval"),
    ],
    ids=[
        "ports-scalar",
        "unknown-top-level-key",
        "missing-dependency",
        "undeclared-volume",
        "bad-duration",
    ],
)
def test_validator_rejects_spec_violations(
    validator: Path,
    raw_compose: dict[str, Any],
    tmp_path: Path,
    mutate: Callable[[dict[str, Any]], None],
    expected: str,
) -> None:
    doc = json.loads(json.dumps(raw_compose))  # deep copy, anchors already expanded
    mutate(doc)
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(yaml.safe_dump(doc, sort_keys=False))
    result = run_validator(validator, broken)
    assert result.returncode != 0, f"validator accepted a file with {expected!r} broken"
    assert expected in result.stderr, result.stderr


def test_every_variable_has_a_default() -> None:
    """`docker compose up` with no .env must work: each ${VAR} carries a :- default."""
    text = re.sub(r"\$\$", "", COMPOSE_FILE.read_text())  # $$ is a literal dollar
    bare = [
        m.group(0)
        for m in re.finditer(r"\$\{[^}]*\}|\$[A-Za-z_]\w*", text)
        if ":-" not in m.group(0)
    ]
    assert not bare, f"variables without a default in docker-compose.yml: {bare}"


# ------------------------------------------------------------------------------ services ------


def test_images_are_the_agreed_series(project: Project) -> None:
    for name, (repository, series) in IMAGE_SERIES.items():
        image = service(project, name)["image"]
        repo_part, _, tag = image.rpartition(":")
        assert repo_part == repository and tag.startswith(series), f"{name}: {image}"


def test_dependencies_wait_for_healthchecks(project: Project) -> None:
    for name in INFRASTRUCTURE:
        test = service(project, name).get("healthcheck", {}).get("test")
        assert test and test[0] in {"CMD", "CMD-SHELL"}, f"{name} has no healthcheck"
    for name, svc in project["services"].items():
        for target, dep in (svc.get("depends_on") or {}).items():
            if target in INIT:
                # A one-shot service: waited for until it exits 0, and never restarted.
                assert dep["condition"] == "service_completed_successfully", f"{name} -> {target}"
                assert project["services"][target].get("restart") == "no", target
                continue
            assert dep["condition"] == "service_healthy", f"{name} -> {target}"
            assert project["services"][target].get("healthcheck"), f"{target} has no healthcheck"


def option(svc: Service, name: str) -> str | None:
    """The value of `--name VALUE` in a service's command line, if given."""
    command = svc.get("command") or []
    for i, arg in enumerate(command[:-1]):
        if arg == name:
            value: str = command[i + 1]
            return value
    return None


def test_loop_services_share_the_image_and_find_the_bus(project: Project) -> None:
    images = set()
    for name in LOOP:
        svc = service(project, name)
        assert svc.get("profiles") == ["loop"], f"{name} must start only with --profile loop"
        assert Path(svc["build"]["context"]) == REPO
        assert svc["build"].get("dockerfile", "Dockerfile") == "Dockerfile"
        images.add(svc["image"])
        if name in INIT:
            continue
        env = svc.get("environment") or {}
        # The Python services read CGLOOP_KAFKA_BOOTSTRAP; the Rust agent takes --kafka.
        bootstrap = env.get("CGLOOP_KAFKA_BOOTSTRAP") or option(svc, "--kafka")
        assert bootstrap, f"{name}: neither CGLOOP_KAFKA_BOOTSTRAP nor --kafka"
        kafka_host, _, kafka_port = bootstrap.rpartition(":")
        if name in HOST_NETWORK:
            # Off the compose network: only the ports published on the host are reachable.
            assert svc.get("network_mode") == "host", name
            assert kafka_host == "127.0.0.1", name
            kafka_ports = {p["published"] for p in service(project, "kafka")["ports"]}
            assert kafka_port in kafka_ports, name
        else:
            assert kafka_host == "kafka", name
    assert len(images) == 1, f"the loop's services use one image, not {images}"


def test_the_store_users_are_the_ones_clickhouse_creates(project: Project) -> None:
    """The sink and analytics log in as a user of deploy/clickhouse/users.d with the password
    ClickHouse gives it, from any address (the built-in `default` is loopback-only there)."""
    root = ET.parse(DEPLOY / "clickhouse/users.d/cgloop.xml").getroot()
    clickhouse_env = service(project, "clickhouse")["environment"]
    users = clickhouse_users()
    with_store = set()
    for name in DAEMONS:
        url = (service(project, name).get("environment") or {}).get("CGLOOP_STORE_URL")
        if not url:
            continue
        with_store.add(name)
        parts = urlsplit(url)
        assert parts.hostname == "clickhouse" and parts.port in published_targets(
            service(project, "clickhouse")
        ), f"{name}: {parts.hostname}:{parts.port}"
        user = unquote(parts.username or "default")
        assert user in users, f"{name} logs in as {user!r}, which {DEPLOY.name}/clickhouse lacks"
        assert unquote(parts.password or "") == clickhouse_env[users[user]], (
            f"{name}: the password of {user!r} is not the one ClickHouse reads ({users[user]})"
        )
        networks = [ip.text for ip in root.findall(f"./users/{user}/networks/ip")]
        assert any(not ipaddress.ip_network(n).is_loopback for n in networks if n), (
            f"ClickHouse accepts {user!r} only from loopback: {networks}"
        )
    assert {"sink", "analytics"} <= with_store


def test_the_onos_url_is_the_one_the_driver_expects(project: Project) -> None:
    """The driver appends /onos/v1 itself: the setting is scheme://host:port only."""
    from cgloop.actuators.onos.client import OnosSettings

    env = service(project, "policy-engine")["environment"]
    url = OnosSettings(url=env["CGLOOP_ONOS_URL"]).url
    parts = urlsplit(url)
    assert parts.path in ("", "/"), f"CGLOOP_ONOS_URL={url} has a path; the driver adds /onos/v1"
    assert parts.hostname == "onos" and parts.port in published_targets(service(project, "onos"))


def test_published_ports_bind_to_loopback_by_default(project: Project) -> None:
    """Nothing is reachable from other machines unless an operator opens it (*_BIND)."""
    published = [
        (name, port)
        for name, svc in project["services"].items()
        for port in svc.get("ports") or []
    ]
    assert published
    wide = [f"{name}: {port}" for name, port in published if port.get("host_ip") != "127.0.0.1"]
    assert not wide, "published on every interface:\n" + "\n".join(wide)


def test_loop_services_take_the_kafka_security_settings(project: Project) -> None:
    for name in DAEMONS:
        env = service(project, name).get("environment") or {}
        for var in (
            "CGLOOP_KAFKA_SECURITY_PROTOCOL",
            "CGLOOP_KAFKA_SASL_USERNAME",
            "CGLOOP_KAFKA_SASL_PASSWORD_FILE",
            "CGLOOP_KAFKA_SSL_CA_LOCATION",
        ):
            assert var in env, f"{name} does not pass {var} through"


def test_the_int_collector_starts_on_its_published_address(project: Project) -> None:
    """The collector refuses a non-loopback listen address without named report sources
    (INT has no integrity check): compose must name them, as valid CIDRs, or it cannot start."""
    env = service(project, "int-collector").get("environment") or {}
    host = env["CGLOOP_INT_LISTEN"].rsplit(":", 1)[0].strip("[]")
    if ipaddress.ip_address(host).is_loopback or env.get("CGLOOP_INT_ALLOW_ANY_SOURCE"):
        return
    sources = (env.get("CGLOOP_INT_ALLOW_SOURCE") or "").split()
    assert sources, "int-collector listens beyond loopback but names no report source"
    for cidr in sources:
        ipaddress.ip_network(cidr)  # raises on anything the collector would refuse


def test_datapath_services_can_load_bpf(project: Project) -> None:
    for name in HOST_NETWORK:
        svc = service(project, name)
        assert svc.get("privileged") or {"BPF", "NET_ADMIN"} <= set(svc.get("cap_add") or []), name
        assert any(m["target"] == "/sys/fs/bpf" for m in bind_mounts(svc)), name


def test_kafka_is_single_node_kraft(project: Project) -> None:
    env = service(project, "kafka")["environment"]
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    voter_id = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split("@")[0]
    assert voter_id == env["KAFKA_NODE_ID"]
    cluster_id = env["CLUSTER_ID"]
    assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16, cluster_id

    def names(listeners: str) -> set[str]:
        return {item.split("://")[0] for item in listeners.split(",")}

    declared = names(env["KAFKA_LISTENERS"])
    assert names(env["KAFKA_ADVERTISED_LISTENERS"]) <= declared
    assert env["KAFKA_CONTROLLER_LISTENER_NAMES"] in declared
    protocol_map = dict(
        kv.split(":") for kv in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(",")
    )
    assert declared <= set(protocol_map)


# ----------------------------------------------------------------------- mounted files ---------


def parse_config_file(path: Path) -> None:
    """Parse a config file by its extension; raise on malformed content."""
    suffix = path.suffix.lower()
    if suffix in {".yaml", ".yml"}:
        yaml.safe_load(path.read_text())
    elif suffix == ".xml":
        ET.parse(path)
    elif suffix == ".json":
        json.loads(path.read_text())


def files_under(path: Path) -> list[Path]:
    return [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())


def test_bind_mounted_files_exist_and_parse(project: Project) -> None:
    mounted: set[Path] = set()
    for name, svc in project["services"].items():
        for mount in bind_mounts(svc):
            source = Path(mount["source"])
            if not source.is_relative_to(REPO):
                assert str(source) in HOST_PATHS, f"{name} mounts host path {source}"
                continue
            assert source.exists(), f"{name} mounts {source.relative_to(REPO)}: missing"
            for file in files_under(source):
                try:
                    parse_config_file(file)
                except (yaml.YAMLError, ET.ParseError, json.JSONDecodeError) as exc:
                    pytest.fail(f"{file.relative_to(REPO)} (mounted by {name}): {exc}")
            mounted.add(source.relative_to(REPO))
    assert {
        Path("deploy/clickhouse/config.d/cgloop.xml"),
        Path("deploy/clickhouse/users.d/cgloop.xml"),
        Path("deploy/grafana/provisioning/datasources"),
        Path("deploy/grafana/provisioning/dashboards"),
        Path("dashboards/provisioned"),
        Path("dashboards/provisioned/alerting"),
        Path("deploy/prometheus/prometheus.yml"),
    } <= mounted


def test_every_deploy_file_parses() -> None:
    files = [p for p in files_under(DEPLOY) if p.suffix in {".yaml", ".yml", ".xml", ".json"}]
    assert files
    for file in files:
        parse_config_file(file)


# ----------------------------------------------------------------------------- grafana ---------


def grafana_mount_target(project: Project, repo_path: str) -> str:
    for mount in bind_mounts(service(project, "grafana")):
        if Path(mount["source"]) == REPO / repo_path:
            target: str = mount["target"]
            return target
    pytest.fail(f"grafana does not mount {repo_path}")


def test_grafana_clickhouse_datasource(project: Project) -> None:
    target = grafana_mount_target(project, "deploy/grafana/provisioning/datasources")
    assert target == "/etc/grafana/provisioning/datasources"
    doc = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/clickhouse.yaml").read_text())
    assert doc["apiVersion"] == 1
    sources = [d for d in doc["datasources"] if d["type"] == "grafana-clickhouse-datasource"]
    assert len(sources) == 1, doc["datasources"]
    json_data = sources[0]["jsonData"]
    assert json_data["host"] == "clickhouse" and "clickhouse" in project["services"]
    protocol = json_data["protocol"]
    assert protocol in CLICKHOUSE_PORTS, protocol
    assert json_data["port"] == CLICKHOUSE_PORTS[protocol]
    assert json_data["port"] in published_targets(service(project, "clickhouse"))
    assert json_data["defaultDatabase"] == "cgloop"
    assert json_data["username"] in clickhouse_users()

    # The password Grafana expands must be the one ClickHouse reads for that user.
    password_ref = sources[0]["secureJsonData"]["password"]
    match = re.fullmatch(r"\$\{?(\w+)\}?", password_ref)
    assert match, f"password should come from the environment, not {password_ref!r}"
    var = match.group(1)
    grafana_env = service(project, "grafana")["environment"]
    clickhouse_env = service(project, "clickhouse")["environment"]
    assert var in grafana_env, f"grafana's environment lacks {var}"
    users_var = clickhouse_users()[json_data["username"]]
    assert grafana_env[var] == clickhouse_env[users_var]


def test_grafana_installs_the_plugin_and_loads_dashboards(project: Project) -> None:
    env = service(project, "grafana")["environment"]
    plugins = ",".join(env.get(var, "") for var in GRAFANA_PLUGIN_VARS)
    assert "grafana-clickhouse-datasource" in plugins.split(",")

    grafana_mount_target(project, "deploy/grafana/provisioning/dashboards")
    doc = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/cgloop.yaml").read_text())
    assert doc["apiVersion"] == 1
    paths = {p["options"]["path"] for p in doc["providers"] if p["type"] == "file"}
    assert paths == {grafana_mount_target(project, "dashboards/provisioned")}


# -------------------------------------------------------------------------- clickhouse ---------


def clickhouse_users() -> dict[str, str]:
    """User name -> the environment variable its password comes from."""
    root = ET.parse(DEPLOY / "clickhouse/users.d/cgloop.xml").getroot()
    users = {}
    for user in root.findall("./users/*"):
        password = user.find("password")
        if password is not None and "from_env" in password.attrib:
            users[user.tag] = password.attrib["from_env"]
    return users


def test_clickhouse_config_and_users(project: Project) -> None:
    config = ET.parse(DEPLOY / "clickhouse/config.d/cgloop.xml").getroot()
    assert config.tag == "clickhouse"
    assert config.findtext("./logger/console") == "1"
    assert {int(config.findtext(p) or 0) for p in ("http_port", "tcp_port")} <= published_targets(
        service(project, "clickhouse")
    )

    root = ET.parse(DEPLOY / "clickhouse/users.d/cgloop.xml").getroot()
    assert root.tag == "clickhouse"
    profiles = {p.tag for p in root.findall("./profiles/*")}
    assert {"cgloop", "grafana"} <= profiles
    assert root.findtext("./profiles/grafana/readonly") == "1"
    for user in root.findall("./users/*"):
        profile = user.findtext("profile")
        assert profile is None or profile in profiles | {"default"}, user.tag

    users = clickhouse_users()
    assert {"cgloop", "grafana"} <= set(users)
    env = service(project, "clickhouse")["environment"]
    for name, var in users.items():
        assert env.get(var), f"clickhouse user {name} reads its password from unset {var}"


# -------------------------------------------------------------------------- Dockerfile ---------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    logical: list[str] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append(pending + stripped)
        pending = ""
    out = []
    for entry in logical:
        keyword, _, args = entry.partition(" ")
        out.append((keyword.upper(), args.strip()))
    return out


def copy_sources_by_stage() -> dict[str, list[str]]:
    """Sources of each stage's COPY/ADD from the build context (not --from=another stage)."""
    stages: dict[str, list[str]] = {}
    current = ""
    for keyword, args in dockerfile_instructions():
        if keyword == "FROM":
            words = args.split()
            current = words[-1] if len(words) >= 3 and words[-2].upper() == "AS" else words[0]
            stages.setdefault(current, [])
        elif keyword in {"COPY", "ADD"}:
            words = json.loads(args) if args.startswith("[") else shlex.split(args)
            flags = [w for w in words if w.startswith("--")]
            if any(f.startswith("--from=") for f in flags):
                continue
            paths = [w for w in words if not w.startswith("--")]
            assert len(paths) >= 2, f"{keyword} {args}"
            stages[current].extend(paths[:-1])
    return stages


def dockerignore_patterns() -> list[str]:
    lines = DOCKERIGNORE.read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]


def test_dockerfile_copy_sources_exist() -> None:
    ignored = dockerignore_patterns()
    sources = [s for stage in copy_sources_by_stage().values() for s in stage]
    assert sources
    for source in sources:
        matches = list(REPO.glob(source)) if source != "." else [REPO]
        assert matches, f"Dockerfile copies {source!r}, which is not in the repository"
        assert not any(fnmatch.fnmatch(source, pattern) for pattern in ignored), (
            f"Dockerfile copies {source!r}, which .dockerignore leaves out of the context"
        )


def test_dockerfile_covers_the_workspaces() -> None:
    """The Rust stage copies every Cargo member; the Python stage every uv member."""
    stages = copy_sources_by_stage()

    def covered(member: str, sources: list[str]) -> bool:
        return any(s == "." or Path(member).is_relative_to(s.rstrip("/")) for s in sources)

    cargo = tomllib.loads((REPO / "Cargo.toml").read_text())
    for pattern in cargo["workspace"]["members"]:
        assert covered(pattern, stages["rust-build"]), f"rust-build does not copy {pattern}"
    uv = tomllib.loads((REPO / "pyproject.toml").read_text())
    for pattern in uv["tool"]["uv"]["workspace"]["members"]:
        assert covered(pattern, stages["python-build"]), f"python-build does not copy {pattern}"


def test_dockerfile_runtime_is_the_cgloop_command() -> None:
    instructions = dockerfile_instructions()
    entrypoints = [json.loads(args) for keyword, args in instructions if keyword == "ENTRYPOINT"]
    assert entrypoints and entrypoints[-1] == ["cgloop"]
    ignored = set(dockerignore_patterns())
    assert {".venv", "target", ".state", ".cache"} <= ignored
    assert any("node_modules" in p for p in ignored)


# ------------------------------------------------------------- what the services run -----------
# No Docker engine here: each cgloop service's entrypoint and command run as their local
# equivalents (the uv-installed `cgloop`, the Rust programs in target/), with the service's
# environment and its named volumes as temporary folders.


def image_entrypoint() -> list[str]:
    entrypoints = [
        json.loads(args) for keyword, args in dockerfile_instructions() if keyword == "ENTRYPOINT"
    ]
    entrypoint: list[str] = entrypoints[-1]
    return entrypoint


def local_program(name: str) -> Path:
    """The local equivalent of a program of the image, or a skip naming how to build it."""
    if name == "cgloop":
        path = Path(sys.executable).parent / "cgloop"
        if not path.is_file():
            pytest.fail(f"the cgloop command is not installed beside {sys.executable}")
        return path
    from cgloop.binaries import BinaryNotFound, find_binary

    try:
        return find_binary(name, prefer_release=False)
    except BinaryNotFound as exc:
        pytest.skip(f"{name} is not built: {exc}")


def service_env(svc: Service, state: Path) -> dict[str, str]:
    """The service's environment and none of this process's CGLOOP_* settings; the image's
    state and cache folders (its ENV, the cgloop-state volume) become private folders."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CGLOOP_")}
    env.update({k: v or "" for k, v in (svc.get("environment") or {}).items()})
    env["CGLOOP_STATE_DIR"] = str(state / "state")
    env["CGLOOP_CACHE_DIR"] = str(state / "cache")
    return env


def local_command(svc: Service, volumes: dict[str, Path]) -> list[str]:
    """The service's command line, each named volume's mount point replaced by its folder."""
    targets = {
        m["target"]: volumes[m["source"]]
        for m in svc.get("volumes") or []
        if m.get("type") == "volume" and m["source"] in volumes
    }
    return [str(targets.get(arg, arg)) for arg in svc.get("command") or []]


def run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def volumes(tmp_path_factory: pytest.TempPathFactory, project: Project) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("volumes")
    return {name: root / name for name in project["volumes"]}


@pytest.fixture(scope="module")
def certs(project: Project, volumes: dict[str, Path], tmp_path_factory) -> Path:
    """Run the init service that makes the node agent's certificates, as compose would."""
    svc = service(project, "node-agent-certs")
    entrypoint = svc.get("entrypoint") or image_entrypoint()
    program = local_program(entrypoint[0])
    cmd = [str(program), *entrypoint[1:], *local_command(svc, volumes)]
    result = run(cmd, service_env(svc, tmp_path_factory.mktemp("certs-env")))
    assert result.returncode == 0, f"node-agent-certs: {shlex.join(cmd)}\n{result.stderr}"
    return volumes["cgloop-certs"]


@pytest.mark.parametrize("name", sorted(DAEMONS))
def test_each_service_runs_a_command_that_takes_its_settings(
    name: str, project: Project, volumes: dict[str, Path], tmp_path: Path
) -> None:
    """`cgloop --check-config CMD` parses the command, its options and the CGLOOP_* settings as
    the service would and stops there; options a wrapper hands on to a Rust program, and the
    Rust programs' own command lines, are parsed by that program (clap, before `--help`)."""
    svc = service(project, name)
    entrypoint = svc.get("entrypoint") or image_entrypoint()
    program = local_program(entrypoint[0])
    env = service_env(svc, tmp_path)
    command = local_command(svc, volumes)
    if entrypoint == ["cgloop"]:
        cmd = [str(program), "--check-config", *command]
        result = run(cmd, env)
        assert result.returncode == 0, f"{name}: {shlex.join(cmd)}\n{result.stdout}{result.stderr}"
        assert "configuration OK" in result.stdout, result.stdout
        handed_on = re.search(r"passed on unparsed: (.*)\)$", result.stdout.strip())
        wrapper = next((c for c in WRAPPERS if tuple(command[: len(c)]) == c), None)
        if handed_on:
            assert wrapper, f"{name}: `cgloop {command[0]}` ignores {handed_on.group(1)}"
        if wrapper is None:
            return
        binary, sub = WRAPPERS[wrapper]
        # What the wrapper runs: its own options are the binary's, then what it hands on.
        cmd = [str(local_program(binary)), sub, *command[len(wrapper) :], "--help"]
    else:
        cmd = [str(program), *entrypoint[1:], *command, "--help"]
    result = run(cmd, env)
    assert result.returncode == 0, f"{name}: {shlex.join(cmd)}\n{result.stderr}"


def test_the_certificates_are_where_agent_and_engine_read_them(
    project: Project, certs: Path
) -> None:
    made = {p.name for p in certs.iterdir()}
    assert made >= AGENT_TLS_FILES | ENGINE_TLS_FILES, sorted(made)
    for name, flag in (("node-agent", "--tls-dir"), ("policy-engine", "--agent-tls-dir")):
        svc = service(project, name)
        mounted = {
            m["target"]: m["source"] for m in svc.get("volumes") or [] if m["type"] == "volume"
        }
        tls_dir = option(svc, flag)
        assert tls_dir and mounted.get(tls_dir) == "cgloop-certs", (
            f"{name}: {flag} {tls_dir} is not where the cgloop-certs volume is mounted"
        )
    # The engine checks the agent's certificate for one name, whatever address it dials.
    import inspect

    from cgloop.policy.actuators import NodeAgentActuator

    checked = inspect.signature(NodeAgentActuator).parameters["server_name"].default
    names = option_values(service(project, "node-agent-certs"), "--server-name")
    assert checked in names, f"the agent's certificate names {names}, the engine checks {checked}"
    agent_id = option(service(project, "node-agent"), "--node-id")
    engine_id = option(service(project, "policy-engine"), "--agent").split("=", 1)[0]
    assert agent_id == engine_id, f"agent node id {agent_id}, engine addresses {engine_id}"


def option_values(svc: Service, name: str) -> list[str]:
    command = svc.get("command") or []
    return [command[i + 1] for i, arg in enumerate(command[:-1]) if arg == name]


def settings_the_code_reads() -> set[str]:
    """Every CGLOOP_* variable a component reads: the fields of cgloop's settings classes
    (pydantic-settings, CGLOOP_ prefixes), the variables of the `cgloop` command's options,
    and the names in the Rust sources (the Kafka security variables)."""
    from cgloop.cli.main import app, load_components
    from pydantic_settings import BaseSettings
    from typer.main import get_command

    for source in REPO.glob("*/src/cgloop/**/*.py"):
        text = source.read_text(errors="replace")
        if "env_prefix" in text and "CGLOOP_" in text:
            parts = source.relative_to(REPO).with_suffix("").parts
            module = ".".join(parts[parts.index("cgloop") :])
            importlib.import_module(module)
    known: set[str] = set()
    classes = list(BaseSettings.__subclasses__())
    while classes:
        cls = classes.pop()
        classes.extend(cls.__subclasses__())
        prefix = str(cls.model_config.get("env_prefix") or "")
        if prefix.upper().startswith("CGLOOP_"):
            known |= {f"{prefix}{field}".upper() for field in cls.model_fields}

    load_components(app)
    commands = [get_command(app)]
    while commands:
        command = commands.pop()
        commands.extend(getattr(command, "commands", {}).values())
        for param in command.params:
            envvar = param.envvar or []
            known |= {envvar} if isinstance(envvar, str) else set(envvar)
    for source in REPO.glob("*/**/src/**/*.rs"):
        if "target" not in source.relative_to(REPO).parts:
            known |= set(re.findall(r'"(CGLOOP_[A-Z0-9_]+)"', source.read_text(errors="replace")))
    return known


def test_every_cgloop_setting_in_the_file_is_read_by_the_code(project: Project) -> None:
    known = settings_the_code_reads()
    assert {"CGLOOP_STATE_DIR", "CGLOOP_ONOS_URL", "CGLOOP_INT_LISTEN"} <= known  # the finder
    unread = sorted(
        f"{name}: {var}"
        for name, svc in project["services"].items()
        for var in svc.get("environment") or {}
        if var.startswith("CGLOOP_") and var not in known
    )
    assert not unread, "set in docker-compose.yml but read by no component:\n" + "\n".join(unread)
    # Variables of the file itself (${...}) are named otherwise, unless they carry a setting.
    text = COMPOSE_FILE.read_text()
    own = sorted({m for m in re.findall(r"\$\{(CGLOOP_\w+)", text) if m not in known})
    assert not own, f"compose variables named like cgloop settings: {own}"


# ------------------------------------------------------------------- self-monitoring ---------
# Compose service -> the daemon of the ops table (proto/cgloop/v1/ops.proto) it runs.
SERVICE_DAEMON = {
    "probe": "DAEMON_PROBE",
    "int-collector": "DAEMON_INT_COLLECTOR",
    "node-agent": "DAEMON_NODE_AGENT",
    "sink": "DAEMON_SINK",
    "analytics": "DAEMON_ANALYTICS",
    "policy-engine": "DAEMON_POLICY_ENGINE",
}


def _metrics_addr(svc: Service, daemon: str) -> str | None:
    """Where the service's daemon serves /metrics: its --metrics-addr or its variable."""
    from cgloop.metrics import env_var
    from cgloop.v1 import ops_pb2

    command = [str(c) for c in svc.get("command") or []]
    if "--metrics-addr" in command:
        return command[command.index("--metrics-addr") + 1]
    env = svc.get("environment") or {}
    value = env.get(env_var(ops_pb2.Daemon.Value(daemon)))
    return None if value is None else str(value)


def test_prometheus_scrapes_every_daemon_at_the_ops_tables_port(project: Project) -> None:
    """Every loop daemon serves /metrics at the port the ops table gives it, on the compose
    network for Prometheus (host-network daemons: on HOST_METRICS_BIND), and Prometheus has one
    job per daemon, named as the table names it, at that service and port."""
    from cgloop.contracts import ops

    table = ops.table()["daemons"]
    config = yaml.safe_load((DEPLOY / "prometheus/prometheus.yml").read_text())
    jobs = {
        j["job_name"]: [t for sc in j["static_configs"] for t in sc["targets"]]
        for j in config["scrape_configs"]
    }
    assert set(jobs) == {d.removeprefix("DAEMON_").lower() for d in SERVICE_DAEMON.values()}
    for name, daemon in SERVICE_DAEMON.items():
        port = table[daemon]["port"]
        svc = service(project, name)
        addr = _metrics_addr(svc, daemon)
        assert addr is not None and addr.endswith(f":{port}"), (name, addr, port)
        host_network = svc.get("network_mode") == "host"
        # compose-network daemons listen on their container's interfaces, not published
        assert host_network or addr == f"0.0.0.0:{port}", (name, addr)
        target = f"{'host.docker.internal' if host_network else name}:{port}"
        assert jobs[daemon.removeprefix("DAEMON_").lower()] == [target], (name, jobs)
        published = [str(p.get("target")) for p in svc.get("ports") or []]
        assert str(port) not in published, f"{name} publishes its metrics port"


def test_grafana_loads_the_alert_rules_and_the_prometheus_datasource(project: Project) -> None:
    from cgloop.dashboards.alerts import PROMETHEUS_UID

    target = grafana_mount_target(project, "dashboards/provisioned/alerting")
    assert target == "/etc/grafana/provisioning/alerting"
    assert list((REPO / "dashboards/provisioned/alerting").glob("*.yaml"))
    doc = yaml.safe_load(
        (DEPLOY / "grafana/provisioning/datasources/prometheus.yaml").read_text()
    )
    (source,) = doc["datasources"]
    assert source["uid"] == PROMETHEUS_UID and source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090"
