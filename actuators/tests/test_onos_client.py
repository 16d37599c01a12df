"""The ONOS driver's HTTP behaviour against a real HTTP server on loopback (the ONOS contract
server): auth, reads, retries with backoff on 5xx and connection errors, none on 4xx, and
retry-safe installs (a retry never installs twice)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from cgloop.actuators.onos import (
    Band,
    ConnectPoint,
    EthTypeCriterion,
    FlowRule,
    IpDscpCriterion,
    IpEcnCriterion,
    MeterInstruction,
    MeterRequest,
    OnosClient,
    OnosRequestError,
    OnosSettings,
    OnosUnavailableError,
    OnosValidationError,
    OutputInstruction,
    PointToPointIntent,
    QueueInstruction,
    Selector,
    Treatment,
)
from cgloop.actuators.onos.contract import OnosContractServer

DEV = "of:0000000000000001"
SECRET = "s3cret-Pa55"
APP = "org.cgloop.actuators"


@pytest.fixture
def onos() -> Iterator[OnosContractServer]:
    with OnosContractServer(password=SECRET) as server:
        server.add_device(DEV)
        server.add_device("of:0000000000000002")
        server.state.hosts.append(
            {
                "id": "00:00:00:00:00:01/None",
                "mac": "00:00:00:00:00:01",
                "vlan": "None",
                "ipAddresses": ["10.0.0.1"],
                "locations": [{"elementId": DEV, "port": "1"}],
            }
        )
        server.state.links.append(
            {
                "src": {"device": DEV, "port": "3"},
                "dst": {"device": "of:0000000000000002", "port": "3"},
                "type": "DIRECT",
                "state": "ACTIVE",
            }
        )
        yield server


class Sleeps(list[float]):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
def client(onos: OnosContractServer, sleeps: Sleeps) -> Iterator[OnosClient]:
    settings = OnosSettings(
        url=onos.url,
        password=SECRET,
        app_name=APP,
        attempts=4,
        backoff_initial_s=0.1,
        backoff_max_s=2.0,
        timeout_s=5,
    )
    with OnosClient(settings, sleep=sleeps) as c:
        yield c


def dscp_flow(priority: int = 40000, dscp: int = 46) -> FlowRule:
    return FlowRule(
        priority=priority,
        device_id=DEV,
        selector=Selector(
            criteria=[EthTypeCriterion(eth_type=0x800), IpDscpCriterion(ip_dscp=dscp)]
        ),
        treatment=Treatment(instructions=[QueueInstruction(queue_id=1), OutputInstruction(port=2)]),
    )


def test_reads_and_app_registration(client: OnosClient) -> None:
    assert [d.id for d in client.devices()] == [DEV, "of:0000000000000002"]
    assert [p.port for p in client.ports(DEV)] == ["1", "2", "3", "4"]
    host = client.hosts()[0]
    assert (host.mac, host.locations[0].element_id, host.locations[0].port) == (
        "00:00:00:00:00:01",
        DEV,
        "1",
    )
    link = client.links()[0]
    assert (link.src.port, link.dst.device) == ("3", "of:0000000000000002")
    first = client.register_app()
    assert first.name == APP and first.id > 1
    assert client.register_app() == first, "registration is idempotent"


def test_install_flow_is_idempotent_and_removable(
    client: OnosClient, onos: OnosContractServer
) -> None:
    ref = client.install_flow(dscp_flow())
    assert ref.device_id == DEV
    assert client.install_flow(dscp_flow()) == ref, "same rule → same ONOS flow id"
    assert len(onos.state.flows) == 1
    stored = onos.state.flows[ref.flow_id]
    assert stored["appId"] == APP
    assert {"type": "IP_DSCP", "ipDscp": 46} in stored["selector"]["criteria"]
    assert client.find_flow(dscp_flow()) == ref, "read back through ONOS's own encoding"
    client.remove_flow(ref)
    assert onos.state.flows == {}
    client.remove_flow(ref)  # already gone: fine


def test_5xx_is_retried_with_growing_backoff(
    client: OnosClient, onos: OnosContractServer, sleeps: Sleeps
) -> None:
    onos.inject("GET", "/devices", 503, times=3)
    assert len(client.devices()) == 2
    assert onos.count("GET", "/devices") == 4
    assert len(sleeps) == 3
    # Exponential with jitter: initial 0.1 s doubling, plus up to 1 s jitter, capped at 2 s.
    for n, s in enumerate(sleeps):
        assert 0.1 * 2**n <= s <= min(2.0, 0.1 * 2**n + 1.0), sleeps


def test_retries_give_up_with_a_clear_error(
    client: OnosClient, onos: OnosContractServer, sleeps: Sleeps
) -> None:
    onos.inject("GET", "/links", 500, times=10)
    with pytest.raises(OnosUnavailableError, match="GET /links: gave up after 4 attempts"):
        client.links()
    assert onos.count("GET", "/links") == 4
    assert len(sleeps) == 3


def test_connection_errors_are_retried(sleeps: Sleeps, onos: OnosContractServer) -> None:
    dead = OnosContractServer()
    url = dead.url
    dead.close()  # nothing listens there any more
    settings = OnosSettings(url=url, attempts=3, backoff_initial_s=0.01, backoff_max_s=0.05)
    with (
        OnosClient(settings, sleep=sleeps) as c,
        pytest.raises(OnosUnavailableError, match=r"ConnectError|connect"),
    ):
        c.devices()
    assert len(sleeps) == 2


def test_4xx_is_not_retried(client: OnosClient, onos: OnosContractServer, sleeps: Sleeps) -> None:
    with pytest.raises(OnosRequestError) as err:
        client.ports("of:00000000000000ff")
    assert err.value.status == 404 and "Device is not found" in str(err.value)
    assert onos.count("GET", "/devices/of:00000000000000ff") == 1
    # An intent for an unregistered application: IntentCodec answers 404, no retry.
    intent = PointToPointIntent(
        app_id="org.unregistered",
        ingress_point=ConnectPoint(device=DEV, port=1),
        egress_point=ConnectPoint(device=DEV, port=2),
    )
    with pytest.raises(OnosRequestError, match="Application ID is not found"):
        client.submit_intent(intent)
    assert onos.count("POST", "/intents") == 1
    assert sleeps == []


@pytest.mark.filterwarnings("ignore::UserWarning")  # the deliberately mistyped field
def test_a_body_onos_would_refuse_is_not_sent(
    client: OnosClient, onos: OnosContractServer, sleeps: Sleeps
) -> None:
    bad = dscp_flow().model_copy(update={"priority": "high"})  # bypasses the model's checks
    with pytest.raises(OnosValidationError, match="priority: 'high' is not of type 'integer'"):
        client.install_flow(bad)
    assert onos.count("POST", "/flows") == 0
    # With client-side validation off, the server refuses it with 400 — and there is no retry.
    client.settings.validate_requests = False
    with pytest.raises(OnosRequestError) as err:
        client.install_flow(bad)
    assert err.value.status == 400
    assert onos.count("POST", "/flows") == 1 and sleeps == []


def test_wrong_password_is_refused_and_never_logged(
    onos: OnosContractServer, sleeps: Sleeps, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "not-" + SECRET
    settings = OnosSettings(url=onos.url, password=wrong)
    with OnosClient(settings, sleep=sleeps) as c:
        with pytest.raises(OnosRequestError) as err:
            c.devices()
        assert err.value.status == 401
        onos.inject("GET", "/hosts", 503)
        settings.password = type(settings.password)(SECRET)
    with OnosClient(settings, sleep=sleeps) as c:
        c.hosts()  # retried once, logged
    assert sleeps and caplog.records, "the retry was logged"
    text = caplog.text + repr(settings) + str(settings) + repr(c) + str(err.value)
    assert SECRET not in text and wrong not in text
    assert "**********" in repr(settings)


def test_url_with_credentials_is_refused() -> None:
    with pytest.raises(ValueError, match="not in the url"):
        OnosSettings(url="http://onos:rocks@127.0.0.1:8181")


def test_retry_after_an_applied_post_adopts_the_flow(
    client: OnosClient, onos: OnosContractServer
) -> None:
    """ONOS applied the flow but answered 500: the retry reads back and does not re-post."""
    onos.inject("POST", "/flows/", 500, after_apply=True)
    ref = client.install_flow(dscp_flow())
    assert onos.count("POST", "/flows/") == 1
    assert onos.count("GET", "/flows/application/") == 1
    assert list(onos.state.flows) == [ref.flow_id]


def test_dropped_connection_after_a_batch_reposts_only_what_is_missing(
    client: OnosClient, onos: OnosContractServer
) -> None:
    rules = [dscp_flow(priority=100 + n, dscp=n) for n in range(3)]
    # First the whole batch is applied but the answer is lost: adopted, nothing re-posted.
    onos.inject("POST", "/flows", 0, after_apply=True)
    refs = client.install_flows(rules)
    assert onos.count("POST", "/flows") == 1
    assert sorted(r.flow_id for r in refs) == sorted(onos.state.flows)
    # Then a batch of which ONOS had installed one rule before failing: only two re-posted.
    more = [dscp_flow(priority=200 + n, dscp=10 + n) for n in range(3)]
    client.install_flow(more[0])
    onos.inject("POST", "/flows", 503)
    posted_before = onos.count("POST", "/flows")
    refs = client.install_flows(more)
    assert onos.count("POST", "/flows") == posted_before + 2
    assert len(onos.state.flows) == 6 and len({r.flow_id for r in refs}) == 3


def test_meter_retry_adopts_and_meter_goes_to_the_flow(
    client: OnosClient, onos: OnosContractServer
) -> None:
    meter = MeterRequest(
        device_id=DEV,
        unit="KB_PER_SEC",
        burst=True,
        bands=[Band(type="DROP", rate=25_000, burst_size=3000)],
    )
    onos.inject("POST", "/meters/", 0, after_apply=True)
    ref = client.add_meter(meter)
    assert onos.count("POST", "/meters/") == 1
    assert list(onos.state.meters[DEV]) == [ref.meter_id]
    flow = dscp_flow().model_copy(
        update={
            "treatment": Treatment(
                instructions=[
                    MeterInstruction(meter_id=int(ref.meter_id)),
                    OutputInstruction(port=2),
                ]
            )
        }
    )
    client.install_flow(flow)
    client.remove_meter(ref)
    assert onos.state.meters[DEV] == {}


def test_intent_retry_adopts(client: OnosClient, onos: OnosContractServer) -> None:
    client.register_app()
    intent = PointToPointIntent(
        app_id=APP,
        priority=300,
        ingress_point=ConnectPoint(device=DEV, port=1),
        egress_point=ConnectPoint(device="of:0000000000000002", port=2),
        selector=Selector(criteria=[EthTypeCriterion(eth_type=0x800), IpEcnCriterion(ip_ecn=1)]),
    )
    onos.inject("POST", "/intents", 502, after_apply=True)
    ref = client.submit_intent(intent)
    assert onos.count("POST", "/intents") == 1
    assert list(onos.state.intents) == [(APP, ref.key)]
    # A second, different intent is not mistaken for the first.
    other = intent.model_copy(update={"egress_point": ConnectPoint(device=DEV, port=3)})
    ref2 = client.submit_intent(other)
    assert ref2 != ref and len(onos.state.intents) == 2
    client.withdraw_intent(ref)
    assert list(onos.state.intents) == [(APP, ref2.key)]
