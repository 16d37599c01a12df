"""The store as a ClickHouse cluster: deploy/clickhouse/cluster/compose.yml over docker-compose.yml
(issue 23), loaded by compose-go as `docker compose -f docker-compose.yml -f
deploy/clickhouse/cluster/compose.yml config` would (the validator of tests/test_compose.py),
and its ClickHouse and Keeper files checked against each other: 2 shards x 2 replicas, the
macros every replicated table's path uses, the Keeper the nodes reach, the cluster the sink's
migrations are rendered for. No Docker engine runs here: what a running cluster does is not
tested (the rendered DDL is, by ClickHouse's parser: datasets/tests/test_cluster_migrations.py).
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from cgloop.datasets.store.cluster import check_cluster_name

from tests.test_compose import (  # noqa: F401 - validator: the session fixture
    COMPOSE_FILE,
    DEPLOY,
    REPO,
    image_entrypoint,
    local_program,
    run,
    run_validator,
    service_env,
    validator,
)

CLUSTER_FILE = DEPLOY / "clickhouse/cluster/compose.yml"
CLUSTER_XML = DEPLOY / "clickhouse/cluster/config.d/cluster.xml"
CLUSTER_USERS = DEPLOY / "clickhouse/cluster/users.d/cgloop.xml"
SINGLE_USERS = DEPLOY / "clickhouse/users.d/cgloop.xml"
KEEPER_XML = DEPLOY / "clickhouse/cluster/keeper/keeper_config.xml"
NODES = {"clickhouse", "clickhouse-1-2", "clickhouse-2-1", "clickhouse-2-2"}
SERVER_CONFIG = "/etc/clickhouse-server/config.d/"
SERVER_USERS = "/etc/clickhouse-server/users.d/cgloop.xml"


def load(binary: Path, *files: Path, profiles: str = "*") -> dict[str, Any]:
    import subprocess

    cmd = [str(binary)]
    for f in files:
        cmd += ["-f", str(f)]
    done = subprocess.run(
        [*cmd, "-workdir", str(REPO), "-profiles", profiles],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    loaded: dict[str, Any] = json.loads(done.stdout)
    return loaded


@pytest.fixture(scope="module")
def cluster(validator: Path) -> dict[str, Any]:  # noqa: F811 - the imported fixture
    return load(validator, COMPOSE_FILE, CLUSTER_FILE)


def mounts(svc: dict[str, Any]) -> dict[str, str]:
    """target -> source (repository-relative for bind mounts)."""
    out = {}
    for m in svc.get("volumes") or []:
        source = m["source"]
        if m.get("type") == "bind":
            source = str(Path(source).relative_to(REPO))
        out[m["target"]] = source
    return out


def test_the_cluster_file_loads_over_the_main_one(
    cluster: dict[str, Any],
    validator: Path,  # noqa: F811
) -> None:
    single = load(validator, COMPOSE_FILE)
    assert set(cluster["services"]) == set(single["services"]) | NODES | {"clickhouse-keeper"}
    # without the loop profile: the infrastructure and the cluster
    infra = load(validator, COMPOSE_FILE, CLUSTER_FILE, profiles="")
    assert NODES | {"clickhouse-keeper"} <= set(infra["services"])
    text = re.sub(r"\$\$", "", CLUSTER_FILE.read_text())
    bare = [m for m in re.findall(r"\$\{[^}]*\}", text) if ":-" not in m]
    assert not bare, f"variables without a default: {bare}"
    for name, svc in cluster["services"].items():
        for port in svc.get("ports") or []:
            assert port.get("host_ip") == "127.0.0.1", (name, port)
    for name in NODES | {"clickhouse-keeper"}:
        svc = cluster["services"][name]
        repo, _, tag = svc["image"].rpartition(":")
        assert repo == "clickhouse/clickhouse-server" and tag.startswith("26."), svc["image"]
        assert svc["healthcheck"]["test"][0] in {"CMD", "CMD-SHELL"}, name
        if name != "clickhouse-keeper":
            assert svc["depends_on"]["clickhouse-keeper"]["condition"] == "service_healthy"
    # only the first node is published (docker-compose.yml's ports); the others are not
    assert all(not cluster["services"][n].get("ports") for n in NODES - {"clickhouse"})


def test_two_shards_of_two_replicas_with_their_macros_and_keeper(cluster: dict[str, Any]) -> None:
    root = ET.parse(CLUSTER_XML).getroot()
    (definition,) = list(root.find("remote_servers") or [])
    sink_env = cluster["services"]["sink"]["environment"]
    assert sink_env["CGLOOP_STORE_CLUSTER"] == definition.tag == check_cluster_name(definition.tag)
    shards = definition.findall("shard")
    assert len(shards) == 2
    placed = set()
    for index, shard in enumerate(shards, start=1):
        assert shard.findtext("internal_replication") == "true"
        replicas = shard.findall("replica")
        assert len(replicas) == 2
        for replica in replicas:
            host, port = replica.findtext("host"), replica.findtext("port")
            svc = cluster["services"][host]
            env = svc["environment"]
            # the macros: this node's shard, and a replica name that is its host name
            assert env["CLICKHOUSE_SHARD"] == str(index) and env["CLICKHOUSE_REPLICA"] == host
            assert (svc.get("hostname") or host) == host
            assert port == ET.parse(DEPLOY / "clickhouse/config.d/cgloop.xml").getroot().findtext(
                "tcp_port"
            )
            assert env.get("CLICKHOUSE_CLUSTER_SECRET"), host
            assert env.get("CLICKHOUSE_CGLOOP_PASSWORD") and env.get("CLICKHOUSE_GRAFANA_PASSWORD")
            on = mounts(svc)
            assert on[SERVER_CONFIG + "cgloop.xml"] == "deploy/clickhouse/config.d/cgloop.xml"
            assert on[SERVER_CONFIG + "cluster.xml"] == str(CLUSTER_XML.relative_to(REPO))
            assert on[SERVER_USERS] == str(CLUSTER_USERS.relative_to(REPO)), host
            assert on["/var/lib/clickhouse"] in cluster["volumes"], host
            placed.add((index, host))
    assert {h for _, h in placed} == NODES and len(placed) == 4
    data = [mounts(cluster["services"][n])["/var/lib/clickhouse"] for n in NODES]
    assert len(set(data)) == 4, data
    macros = root.find("macros")
    assert macros is not None
    assert {m.tag: m.get("from_env") for m in macros} == {
        "shard": "CLICKHOUSE_SHARD",
        "replica": "CLICKHOUSE_REPLICA",
    }
    # Keeper: where the nodes look for it is where it listens
    keeper = ET.parse(KEEPER_XML).getroot().find("keeper_server")
    assert keeper is not None
    node = root.find("zookeeper/node")
    assert node is not None
    svc = cluster["services"]["clickhouse-keeper"]
    assert (
        node.findtext("host")
        == svc["hostname"]
        == keeper.findtext("raft_configuration/server/hostname")
    )
    assert node.findtext("port") == keeper.findtext("tcp_port")
    config_arg = next(a for a in svc["command"] if a.startswith("--config-file="))
    assert mounts(svc)[config_arg.split("=", 1)[1]] == str(KEEPER_XML.relative_to(REPO))
    health = " ".join(svc["healthcheck"]["test"])
    assert f"127.0.0.1:{keeper.findtext('http_control/port')}/ready" in health, health
    assert f"--port {keeper.findtext('tcp_port')}" in health, health


def _grants(root: ET.Element, user: str) -> list[str]:
    return [q.text or "" for q in root.findall(f"./users/{user}/grants/query")]


def test_the_cluster_users_are_the_single_servers_plus_what_a_cluster_needs() -> None:
    single, clustered = ET.parse(SINGLE_USERS).getroot(), ET.parse(CLUSTER_USERS).getroot()
    for section in ("profiles", "users"):
        assert [e.tag for e in clustered.find(section) or []] == [
            e.tag for e in single.find(section) or []
        ]
    for profile in single.find("profiles") or []:
        theirs = {e.tag: (e.text or "").strip() for e in profile if len(e) == 0}
        ours = {e.tag: (e.text or "").strip() for e in clustered.find(f"profiles/{profile.tag}")}
        assert {k: ours.get(k) for k in theirs} == theirs, profile.tag
        assert ours["distributed_product_mode"] == "global", profile.tag
    for user in single.find("users") or []:
        for part in ("password", "networks", "profile", "quota"):
            a, b = user.find(part), clustered.find(f"users/{user.tag}/{part}")
            assert (a is None) == (b is None), (user.tag, part)
            if a is not None and b is not None:
                assert ET.tostring(a).strip() == ET.tostring(b).strip(), (user.tag, part)
        assert _grants(clustered, user.tag)[: len(_grants(single, user.tag))] == _grants(
            single, user.tag
        )
    extra = set(_grants(clustered, "cgloop")) - set(_grants(single, "cgloop"))
    assert extra == {"GRANT ALL ON cgloop_meta.*", "GRANT CLUSTER ON *.*"}, extra


def test_the_sink_of_the_cluster_takes_its_settings(
    cluster: dict[str, Any], tmp_path: Path
) -> None:
    """`cgloop --check-config sink` with the sink's merged environment (CGLOOP_STORE_CLUSTER
    among it) parses as the service would."""
    svc = cluster["services"]["sink"]
    assert svc["deploy"]["replicas"] >= 2  # several sinks, one consumer group
    assert image_entrypoint() == ["cgloop"]
    cmd = [str(local_program("cgloop")), "--check-config", *svc["command"]]
    result = run(cmd, service_env(svc, tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "configuration OK" in result.stdout
    bad = run(cmd, {**service_env(svc, tmp_path), "CGLOOP_STORE_CLUSTER": "no-dashes"})
    assert bad.returncode != 0 and "CGLOOP_STORE_CLUSTER='no-dashes'" in bad.stdout + bad.stderr
