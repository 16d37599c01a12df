"""HTTP client of ONOS's REST API (`/onos/v1`): retries, auth, and retry-safe installs.

Retry policy: connection errors and 5xx answers are retried with exponential backoff and
jitter; 4xx answers are not (the request itself is wrong). A POST that failed may still have
been applied by ONOS, so before every re-post the client reads back what exists and adopts a
match instead of installing twice:
- flows: ONOS derives a flow's id from its application, device, priority, table and match
  (DefaultFlowRule.Builder.computeFlowId), so a flow is identified by exactly those fields,
  read back from `GET /flows/application/{appName}`;
- meters and intents get ids from ONOS; the client lists them before the first attempt and, on
  a retry, adopts a new one whose content equals the request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar
from urllib.parse import quote, unquote, urlsplit

import httpx
from cgloop.actuators.onos import validation
from cgloop.actuators.onos.errors import (
    OnosRequestError,
    OnosServerError,
    OnosUnavailableError,
    OnosValidationError,
)
from cgloop.actuators.onos.models import (
    Criterion,
    Device,
    FlowRule,
    Host,
    Link,
    MeterRequest,
    PointToPointIntent,
    Port,
)
from pydantic import BaseModel, Field, SecretStr, TypeAdapter, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
_criterion = TypeAdapter(Criterion)


class OnosSettings(BaseSettings):
    """Where ONOS is and how to talk to it (env CGLOOP_ONOS_*). The password is a SecretStr:
    it never appears in repr, logs or errors."""

    model_config = SettingsConfigDict(env_prefix="CGLOOP_ONOS_", extra="ignore")

    url: str = "http://127.0.0.1:8181"
    username: str = "onos"
    # ONOS's factory default, as in the lab's docker-compose.yml; set your own elsewhere.
    password: SecretStr = SecretStr("rocks")
    # The application name flows, intents and registration are filed under.
    app_name: str = "org.cgloop.actuators"
    timeout_s: float = Field(default=5.0, gt=0)
    # Attempts in total (1 = no retry) for connection errors and 5xx.
    attempts: int = Field(default=4, ge=1, le=20)
    backoff_initial_s: float = Field(default=0.2, ge=0)
    backoff_max_s: float = Field(default=3.0, ge=0)
    # Check every body against ONOS's definitions and codec rules before sending it.
    validate_requests: bool = True

    @field_validator("url")
    @classmethod
    def _no_userinfo(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"ONOS url must be http(s)://host[:port], got {parts.scheme}://…")
        if parts.username or parts.password:
            raise ValueError("put credentials in username/password, not in the url")
        return v.rstrip("/")


class FlowRef(BaseModel):
    device_id: str
    flow_id: str


class MeterRef(BaseModel):
    device_id: str
    meter_id: str


class IntentRef(BaseModel):
    app_id: str
    key: str


class AppId(BaseModel):
    name: str
    id: int


def _seg(value: str) -> str:
    return quote(value, safe=":")


def _message(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:200] or resp.reason_phrase
    if isinstance(body, dict) and "message" in body:
        return str(body["message"])
    return str(body)[:200]


def _location_tail(resp: httpx.Response, parts: int) -> list[str]:
    location = resp.headers.get("location", "")
    tail = [unquote(p) for p in urlsplit(location).path.split("/") if p][-parts:]
    if len(tail) != parts:
        raise OnosRequestError(
            "POST",
            str(resp.request.url.path),
            resp.status_code,
            f"no usable Location header ({location!r})",
        )
    return tail


class OnosClient:
    """Synchronous ONOS REST client. Use as a context manager or call close()."""

    def __init__(
        self,
        settings: OnosSettings | None = None,
        *,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings or OnosSettings()
        s = self.settings
        self._http = httpx.Client(
            base_url=f"{s.url}/onos/v1",
            auth=httpx.BasicAuth(s.username, s.password.get_secret_value()),
            timeout=s.timeout_s,
            transport=transport,
            headers={"Accept": "application/json"},
        )
        self._sleep = sleep

    def __repr__(self) -> str:
        return f"OnosClient(url={self.settings.url!r}, user={self.settings.username!r})"

    def __enter__(self) -> OnosClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # --- transport ------------------------------------------------------------------------------

    def _once(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        started = time.perf_counter()
        resp = self._http.request(method, path, **kwargs)
        log.debug(
            "%s %s -> %d (%.1f ms)",
            method,
            path,
            resp.status_code,
            (time.perf_counter() - started) * 1e3,
        )
        if resp.status_code >= 500:
            raise OnosServerError(method, path, resp.status_code, _message(resp))
        if resp.status_code >= 400:
            raise OnosRequestError(method, path, resp.status_code, _message(resp))
        return resp

    def _call(
        self,
        method: str,
        path: str,
        send: Callable[[], httpx.Response] | None = None,
        adopt: Callable[[], T | None] | None = None,
        **kwargs: Any,
    ) -> httpx.Response | T:
        """One logical request: retried on connection errors and 5xx; before a retry, `adopt`
        may return what an earlier attempt already created, which ends the call."""
        s = self.settings
        retrying = Retrying(
            stop=stop_after_attempt(s.attempts),
            wait=wait_exponential_jitter(multiplier=s.backoff_initial_s, max=s.backoff_max_s),
            retry=retry_if_exception_type((httpx.TransportError, OnosServerError)),
            sleep=self._sleep,
            reraise=True,
            before_sleep=lambda st: log.warning(
                "%s %s: %s; attempt %d of %d failed, retrying",
                method,
                path,
                type(st.outcome.exception()).__name__ if st.outcome else "?",
                st.attempt_number,
                s.attempts,
            ),
        )
        try:
            for attempt in retrying:
                with attempt:
                    if attempt.retry_state.attempt_number > 1 and adopt is not None:
                        found = adopt()
                        if found is not None:
                            log.info("%s %s: adopted what an earlier attempt created", method, path)
                            return found
                    return send() if send else self._once(method, path, **kwargs)
        except (httpx.TransportError, OnosServerError) as e:
            raise OnosUnavailableError(
                f"{method} {path}: gave up after {s.attempts} attempts: {type(e).__name__}: {e}"
            ) from e
        raise AssertionError("unreachable: tenacity either returns or raises")

    def _get(self, path: str, key: str | None = None, **params: Any) -> Any:
        resp = self._call("GET", path, params=params or None)
        assert isinstance(resp, httpx.Response)
        body = resp.json()
        return body.get(key, []) if key else body

    def _check(self, kind: str, body: dict[str, Any]) -> None:
        if self.settings.validate_requests:
            if kind == "IntentPoint":
                validation.validate_intent(body)
            else:
                validation.validate(kind, body)

    # --- reads ----------------------------------------------------------------------------------

    def devices(self) -> list[Device]:
        return [Device.model_validate(d) for d in self._get("/devices", "devices")]

    def ports(self, device_id: str) -> list[Port]:
        return [
            Port.model_validate(p) for p in self._get(f"/devices/{_seg(device_id)}/ports", "ports")
        ]

    def hosts(self) -> list[Host]:
        return [Host.model_validate(h) for h in self._get("/hosts", "hosts")]

    def links(self) -> list[Link]:
        return [Link.model_validate(link) for link in self._get("/links", "links")]

    def flows(self, app_name: str | None = None) -> list[dict[str, Any]]:
        app = app_name or self.settings.app_name
        return list(self._get(f"/flows/application/{_seg(app)}", "flows"))

    def meters(self, device_id: str) -> list[dict[str, Any]]:
        return list(self._get(f"/meters/{_seg(device_id)}", "meters"))

    def intents(self) -> list[dict[str, Any]]:
        return list(self._get("/intents", "intents"))

    # --- application id -------------------------------------------------------------------------

    def register_app(self, name: str | None = None) -> AppId:
        """Register (or look up: ONOS returns the existing id) the application id."""
        app = name or self.settings.app_name
        resp = self._call("POST", f"/applications/{_seg(app)}/register")
        assert isinstance(resp, httpx.Response)
        return AppId.model_validate(resp.json())

    # --- flows ----------------------------------------------------------------------------------

    def _flow_body(self, rule: FlowRule) -> dict[str, Any]:
        body = rule.model_copy(update={"app_id": rule.app_id or self.settings.app_name}).to_json()
        return body

    def find_flow(self, rule: FlowRule) -> FlowRef | None:
        """The installed flow that is the same entry as `rule`, read back from ONOS."""
        want = rule.identity()
        for flow in self.flows(rule.app_id or self.settings.app_name):
            ref = _flow_identity(flow)
            if ref is not None and ref[0] == want:
                return ref[1]
        return None

    def install_flow(self, rule: FlowRule) -> FlowRef:
        """`POST /flows/{deviceId}?appId=…`; retry-safe (see module docstring)."""
        body = self._flow_body(rule)
        self._check("FlowsPost", body)
        path = f"/flows/{_seg(rule.device_id)}"
        resp = self._call(
            "POST",
            path,
            adopt=lambda: self.find_flow(rule),
            json=body,
            params={"appId": body["appId"]},
        )
        if isinstance(resp, FlowRef):
            return resp
        device, flow_id = _location_tail(resp, 2)
        return FlowRef(device_id=device, flow_id=flow_id)

    def install_flows(self, rules: Iterable[FlowRule]) -> list[FlowRef]:
        """Batch `POST /flows?appId=…`; a retry re-posts only the rules not yet installed."""
        rules = list(rules)
        if not rules:
            return []
        app = self.settings.app_name
        bodies = [self._flow_body(r) for r in rules]
        self._check("FlowsBatchPost", {"flows": bodies})
        done: dict[int, FlowRef] = {}

        def adopt() -> list[FlowRef] | None:
            installed: dict[Any, FlowRef] = {}
            for flow in self.flows(app):
                ref = _flow_identity(flow)
                if ref is not None:
                    installed[ref[0]] = ref[1]
            for i, r in enumerate(rules):
                if i not in done and r.identity() in installed:
                    done[i] = installed[r.identity()]
            return [done[i] for i in range(len(rules))] if len(done) == len(rules) else None

        def send() -> httpx.Response:
            pending = [bodies[i] for i in range(len(rules)) if i not in done]
            return self._once("POST", "/flows", json={"flows": pending}, params={"appId": app})

        resp = self._call("POST", "/flows", send=send, adopt=adopt)
        if isinstance(resp, list):
            return resp
        created = [
            FlowRef(device_id=f["deviceId"], flow_id=str(f["flowId"]))
            for f in resp.json().get("flows", [])
        ]
        pending = [i for i in range(len(rules)) if i not in done]
        if len(created) != len(pending):
            raise OnosRequestError(
                "POST",
                "/flows",
                resp.status_code,
                f"{len(created)} flows acknowledged for {len(pending)} sent",
            )
        done.update(zip(pending, created, strict=True))
        return [done[i] for i in range(len(rules))]

    def remove_flow(self, ref: FlowRef) -> None:
        """DELETE; a flow that is already gone counts as removed."""
        try:
            self._call("DELETE", f"/flows/{_seg(ref.device_id)}/{_seg(ref.flow_id)}")
        except OnosRequestError as e:
            if e.status != 404:
                raise

    # --- meters ---------------------------------------------------------------------------------

    def add_meter(self, meter: MeterRequest) -> MeterRef:
        body = meter.to_json()
        self._check("MeterPost", body)
        before = {str(m.get("id")) for m in self.meters(meter.device_id)}

        def adopt() -> MeterRef | None:
            for m in self.meters(meter.device_id):
                if str(m.get("id")) not in before and _same_meter(m, body):
                    return MeterRef(device_id=meter.device_id, meter_id=str(m["id"]))
            return None

        resp = self._call("POST", f"/meters/{_seg(meter.device_id)}", adopt=adopt, json=body)
        if isinstance(resp, MeterRef):
            return resp
        device, meter_id = _location_tail(resp, 2)
        return MeterRef(device_id=device, meter_id=meter_id)

    def remove_meter(self, ref: MeterRef) -> None:
        try:
            self._call("DELETE", f"/meters/{_seg(ref.device_id)}/{_seg(ref.meter_id)}")
        except OnosRequestError as e:
            if e.status != 404:
                raise

    # --- intents --------------------------------------------------------------------------------

    def submit_intent(self, intent: PointToPointIntent) -> IntentRef:
        """`POST /intents`; the app id must be registered first (IntentCodec answers 404)."""
        body = intent.to_json()
        self._check("IntentPoint", body)
        before = {i.get("key") for i in self.intents() if i.get("appId") == intent.app_id}

        def adopt() -> IntentRef | None:
            for i in self.intents():
                key = i.get("key")
                if i.get("appId") != intent.app_id or key in before or i.get("type") != intent.type:
                    continue
                detail = self._get(f"/intents/{_seg(intent.app_id)}/{_seg(str(key))}")
                if _same_intent(detail, body):
                    return IntentRef(app_id=intent.app_id, key=str(key))
            return None

        resp = self._call("POST", "/intents", adopt=adopt, json=body)
        if isinstance(resp, IntentRef):
            return resp
        app, key = _location_tail(resp, 2)
        return IntentRef(app_id=app, key=key)

    def withdraw_intent(self, ref: IntentRef) -> None:
        try:
            self._call("DELETE", f"/intents/{_seg(ref.app_id)}/{_seg(ref.key)}")
        except OnosRequestError as e:
            if e.status != 404:
                raise


def _criteria_key(criteria: Iterable[dict[str, Any]]) -> frozenset[str] | None:
    keys = set()
    for c in criteria:
        try:
            keys.add(repr(sorted(_criterion.validate_python(c).to_json().items())))
        except ValidationError:
            return None  # a criterion we never install: not one of ours
    return frozenset(keys)


def _flow_identity(flow: dict[str, Any]) -> tuple[Any, FlowRef] | None:
    """(identity, ref) of a flow as ONOS encodes it (FlowRuleCodec.encode)."""
    try:
        criteria = _criteria_key(flow.get("selector", {}).get("criteria", []))
        if criteria is None:
            return None
        identity = (flow["deviceId"], int(flow["priority"]), int(flow.get("tableId", 0)), criteria)
        return identity, FlowRef(device_id=flow["deviceId"], flow_id=str(flow["id"]))
    except (KeyError, TypeError, ValueError):
        return None


def _same_meter(meter: dict[str, Any], body: dict[str, Any]) -> bool:
    def bands(bs: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return sorted(
            (b.get("type"), int(b.get("rate", -1)), int(b.get("burstSize", 0))) for b in bs
        )

    try:
        return meter.get("unit") == body["unit"] and bands(meter.get("bands", [])) == bands(
            body["bands"]
        )
    except (TypeError, ValueError):
        return False


def _same_intent(detail: dict[str, Any], body: dict[str, Any]) -> bool:
    def point(p: dict[str, Any] | None) -> tuple[str, str]:
        p = p or {}
        return str(p.get("device")), str(p.get("port"))

    if point(detail.get("ingressPoint")) != point(body["ingressPoint"]):
        return False
    if point(detail.get("egressPoint")) != point(body["egressPoint"]):
        return False
    mine = _criteria_key(body.get("selector", {}).get("criteria", []))
    return _criteria_key(detail.get("selector", {}).get("criteria", [])) == mine


__all__ = [
    "AppId",
    "FlowRef",
    "IntentRef",
    "MeterRef",
    "OnosClient",
    "OnosSettings",
    "OnosValidationError",
]
