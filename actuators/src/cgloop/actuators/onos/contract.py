"""An ONOS contract server: a small real HTTP server that answers the REST calls the driver
makes the way ONOS does, and refuses what ONOS would refuse.

No complete ONOS can be built here, so tests (ours, and other components' that need an ONOS)
run against this. It is written independently of the driver's models and of its schema check:
bodies are decoded by the rules of ONOS's codecs (`codecs.py` for selectors and treatments,
FlowRuleCodec, MeterRequestCodec, MeterBandCodec, IntentCodec, PointToPointIntentCodec here),
and what ONOS's decoders throw on (IllegalArgumentException) is answered with 400 and ONOS's
error body `{"code": 400, "message": …}`, like ONOS's exception mappers. ONOS never checks a
body against its published REST definitions (they document, the codecs decide), so neither
does this server. Flow ids are derived from the application id and the flow's device,
priority, table and match, as DefaultFlowRule does, so re-posting the same flow replaces it.

Faults can be injected per request (`inject`): an HTTP status before or after the request is
applied, or a dropped connection before or after it is applied.
"""

from __future__ import annotations

import base64
import json
import threading
import zlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from cgloop.actuators.onos.codecs import CodecError, decode_selector, decode_treatment

PREFIX = "/onos/v1"
REST_APP = "org.onosproject.rest"
FLOW_PRIORITY_MAX = 65535  # FlowRule.MAX_PRIORITY


class Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _require(node: dict[str, Any], member: str, where: str) -> Any:
    # Tools.nullIsIllegal → IllegalArgumentException → 400.
    if not isinstance(node, dict) or node.get(member) is None:
        raise Refused(400, f"{member} member is required in {where}")
    return node[member]


def _int(value: Any, member: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise Refused(400, f"{member} must be an integer, not {value!r}")
    return value


@dataclass
class Fault:
    method: str
    path: str  # prefix under /onos/v1
    status: int = 503  # 0 = drop the connection
    after_apply: bool = False


@dataclass
class ContractState:
    apps: dict[str, int] = field(default_factory=lambda: {REST_APP: 1})
    flows: dict[str, dict[str, Any]] = field(default_factory=dict)
    meters: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    intents: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    devices: list[dict[str, Any]] = field(default_factory=list)
    ports: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    hosts: list[dict[str, Any]] = field(default_factory=list)
    links: list[dict[str, Any]] = field(default_factory=list)
    requests: list[tuple[str, str]] = field(default_factory=list)
    next_meter: int = 1
    next_intent: int = 1


class OnosContractServer:
    """Serve on 127.0.0.1 (port 0 = any free port). `with OnosContractServer() as s: s.url`."""

    def __init__(self, username: str = "onos", password: str = "rocks", port: int = 0) -> None:
        self.username = username
        self.password = password
        self.state = ContractState()
        self.faults: list[Fault] = []
        self.lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> OnosContractServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._thread.is_alive():
            self._httpd.shutdown()
        self._httpd.server_close()

    def inject(
        self,
        method: str,
        path: str,
        status: int = 503,
        *,
        after_apply: bool = False,
        times: int = 1,
    ) -> None:
        self.faults.extend(Fault(method, path, status, after_apply) for _ in range(times))

    def add_device(self, device_id: str, ports: int = 4) -> None:
        self.state.devices.append(
            {
                "id": device_id,
                "type": "SWITCH",
                "available": True,
                "role": "MASTER",
                "driver": "ovs",
            }
        )
        self.state.ports[device_id] = [
            {
                "element": device_id,
                "port": str(p),
                "isEnabled": True,
                "type": "copper",
                "portSpeed": 10000,
            }
            for p in range(1, ports + 1)
        ]

    def count(self, method: str, path_prefix: str) -> int:
        return sum(1 for m, p in self.state.requests if m == method and p.startswith(path_prefix))

    # --- dispatch -------------------------------------------------------------------------------

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt: str, *args: Any) -> None:  # quiet
                pass

            def _serve(self, method: str) -> None:
                parts = urlsplit(self.path)
                path = unquote(parts.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                expected = (
                    "Basic "
                    + base64.b64encode(f"{server.username}:{server.password}".encode()).decode()
                )
                if self.headers.get("Authorization") != expected:
                    return self._send(
                        401,
                        {"code": 401, "message": "Unauthorized"},
                        {"WWW-Authenticate": 'Basic realm="karaf"'},
                    )
                if not path.startswith(PREFIX):
                    return self._send(404, {"code": 404, "message": "Not Found"})
                sub = path[len(PREFIX) :]
                with server.lock:
                    server.state.requests.append((method, sub))
                    fault = next(
                        (f for f in server.faults if f.method == method and sub.startswith(f.path)),
                        None,
                    )
                    if fault:
                        server.faults.remove(fault)
                if fault and not fault.after_apply:
                    return self._fail(fault)
                try:
                    body = json.loads(raw) if raw else None
                    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
                    with server.lock:
                        status, payload, headers = server._route(method, sub, body, query)
                except Refused as e:
                    status, payload, headers = (
                        e.status,
                        {"code": e.status, "message": e.message},
                        {},
                    )
                except CodecError as e:
                    status, payload, headers = 400, {"code": 400, "message": str(e)}, {}
                except (ValueError, TypeError, KeyError, AttributeError) as e:
                    status, payload, headers = 400, {"code": 400, "message": str(e)}, {}
                if fault:
                    return self._fail(fault)
                self._send(status, payload, headers)

            def _fail(self, fault: Fault) -> None:
                if fault.status == 0:
                    self.close_connection = True  # no answer at all: a transport error
                    return
                self._send(fault.status, {"code": fault.status, "message": "injected fault"})

            def _send(
                self, status: int, payload: Any, headers: dict[str, str] | None = None
            ) -> None:
                data = b"" if payload is None else json.dumps(payload).encode()
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def do_DELETE(self) -> None:
                self._serve("DELETE")

        return Handler

    def _location(self, *segments: str) -> dict[str, str]:
        return {"Location": f"{self.url}{PREFIX}/" + "/".join(segments)}

    def _route(
        self, method: str, sub: str, body: Any, query: dict[str, str]
    ) -> tuple[int, Any, dict[str, str]]:
        seg = [s for s in sub.split("/") if s]
        st = self.state
        match method, seg:
            case "GET", ["devices"]:
                return 200, {"devices": st.devices}, {}
            case "GET", ["devices", dev, "ports"]:
                if dev not in st.ports:
                    raise Refused(404, "Device is not found")
                return 200, {"id": dev, "ports": st.ports[dev]}, {}
            case "GET", ["hosts"]:
                return 200, {"hosts": st.hosts}, {}
            case "GET", ["links"]:
                return 200, {"links": st.links}, {}
            case "POST", ["applications", name, "register"]:
                st.apps.setdefault(name, max(st.apps.values()) + 1)
                return 200, {"name": name, "id": st.apps[name]}, {}
            case "GET", ["flows", "application", app]:
                return 200, {"flows": [f for f in st.flows.values() if f["appId"] == app]}, {}
            case "POST", ["flows", dev]:
                self._object(body)
                if body.get("deviceId") not in (None, dev):
                    raise Refused(400, "Invalid deviceId in flow creation request")
                body["deviceId"] = dev
                if "appId" in query:
                    body["appId"] = query["appId"]
                flow = self._add_flow(body)
                return 201, None, self._location("flows", dev, flow["id"])
            case "POST", ["flows"]:
                self._object(body)
                batch = _require(body, "flows", "FlowsBatch")
                if not isinstance(batch, list):
                    raise Refused(400, "flows member must be an array")
                made = []
                for f in batch:
                    self._object(f)
                    if "appId" in query:
                        f["appId"] = query["appId"]
                    flow = self._add_flow(f)
                    made.append({"deviceId": flow["deviceId"], "flowId": flow["id"]})
                return 200, {"flows": made}, {}
            case "DELETE", ["flows", dev, flow_id]:
                flow = st.flows.get(flow_id)
                if flow is None or flow["deviceId"] != dev:
                    raise Refused(404, "Flow is not found")
                del st.flows[flow_id]
                return 204, None, {}
            case "GET", ["meters", dev]:
                return 200, {"meters": list(st.meters.get(dev, {}).values())}, {}
            case "POST", ["meters", dev]:
                self._object(body)
                meter = self._decode_meter(body, dev)
                return 201, None, self._location("meters", dev, meter["id"])
            case "DELETE", ["meters", dev, meter_id]:
                if st.meters.get(dev, {}).pop(meter_id, None) is None:
                    raise Refused(404, "Meter is not found")
                return 204, None, {}
            case "GET", ["intents"]:
                return (
                    200,
                    {
                        "intents": [
                            {k: i[k] for k in ("type", "id", "key", "appId", "state", "resources")}
                            for i in st.intents.values()
                        ]
                    },
                    {},
                )
            case "GET", ["intents", app, key]:
                if (app, key) not in st.intents:
                    raise Refused(404, "Intent is not found")
                return 200, st.intents[(app, key)], {}
            case "POST", ["intents"]:
                self._object(body)
                intent = self._decode_intent(body)
                return 201, None, self._location("intents", intent["appId"], intent["key"])
            case "DELETE", ["intents", app, key]:
                if st.intents.pop((app, key), None) is None:
                    raise Refused(404, "Intent is not found")
                return 204, None, {}
        raise Refused(404, f"no resource {method} {PREFIX}{sub}")

    # --- codec rules ----------------------------------------------------------------------------

    @staticmethod
    def _object(body: Any) -> None:
        if not isinstance(body, dict):
            raise Refused(400, "request body must be a JSON object")

    def _add_flow(self, body: dict[str, Any]) -> dict[str, Any]:
        priority = _int(_require(body, "priority", "FlowRule"), "priority")
        if not 0 <= priority <= FLOW_PRIORITY_MAX:  # DefaultFlowRule's checkArgument
            raise Refused(400, f"Priority {priority} is not in [0, {FLOW_PRIORITY_MAX}]")
        permanent = _require(body, "isPermanent", "FlowRule")
        if not isinstance(permanent, bool):
            raise Refused(400, "isPermanent must be a boolean")
        timeout = 0 if permanent else _int(_require(body, "timeout", "FlowRule"), "timeout")
        dev = str(_require(body, "deviceId", "FlowRule"))
        app = str(body.get("appId") or REST_APP)
        self.state.apps.setdefault(app, max(self.state.apps.values()) + 1)  # registerApplication
        table = _int(body.get("tableId", 0), "tableId")
        criteria = decode_selector(body.get("selector"))
        treatment = decode_treatment(body.get("treatment"))
        identity = json.dumps(
            [dev, priority, table, sorted(json.dumps(c, sort_keys=True) for c in criteria)]
        )
        flow_id = str((self.state.apps[app] << 48) | zlib.crc32(identity.encode()))
        flow = {
            "id": flow_id,
            "appId": app,
            "priority": priority,
            "timeout": timeout,
            "isPermanent": permanent,
            "deviceId": dev,
            "tableId": table,
            "tableName": str(table),
            "state": "ADDED",
            "treatment": treatment,
            "selector": {"criteria": criteria},
        }
        self.state.flows[flow_id] = flow  # same id: the entry is replaced, never doubled
        return flow

    def _decode_meter(self, body: dict[str, Any], dev: str) -> dict[str, Any]:
        _require(body, "deviceId", "MeterRequest")
        unit = _require(body, "unit", "MeterRequest")
        if unit not in ("KB_PER_SEC", "PKTS_PER_SEC"):
            raise Refused(400, f"The requested unit {unit} is not defined for meter.")
        bands = []
        for b in _require(body, "bands", "MeterRequest"):
            _require(b, "rate", "Band")
            _require(b, "burstSize", "Band")
            kind = _require(b, "type", "Band")
            if kind not in ("DROP", "REMARK", "NONE", "MARK_YELLOW", "MARK_RED"):
                raise Refused(400, f"The requested type {kind} is not defined for band.")
            band = {
                "type": kind,
                "rate": int(b["rate"]),
                "burstSize": int(b["burstSize"]),
                "packets": 0,
                "bytes": 0,
            }
            if kind == "REMARK":
                band["prec"] = int(_require(b, "prec", "Band"))
            bands.append(band)
        meter_id = str(self.state.next_meter)
        self.state.next_meter += 1
        meter = {
            "id": meter_id,
            "appId": REST_APP,
            "deviceId": dev,
            "unit": unit,
            "burst": bool(body.get("burst", False)),
            "state": "ADDED",
            "bands": bands,
        }
        self.state.meters.setdefault(dev, {})[meter_id] = meter
        return meter

    def _decode_intent(self, body: dict[str, Any]) -> dict[str, Any]:
        kind = _require(body, "type", "Intent")
        if kind != "PointToPointIntent":
            raise Refused(400, f"Intent type {kind} is not supported")
        app = str(_require(body, "appId", "Intent"))
        if app not in self.state.apps:
            raise Refused(404, "Application ID is not found")
        points = {}
        for name in ("ingressPoint", "egressPoint"):
            p = _require(body, name, "Intent")
            if "device" not in p or "port" not in p:
                raise Refused(400, f"{name} needs device and port")
            points[name] = {"device": str(p["device"]), "port": str(p["port"])}
        number = self.state.next_intent
        self.state.next_intent += 1
        key = f"0x{number:x}"
        intent = {
            "type": kind,
            "id": key,
            "key": key,
            "appId": app,
            "state": "INSTALLED",
            "resources": [],
            "priority": int(body.get("priority", 100)),
            "selector": {"criteria": decode_selector(body.get("selector"))},
            "treatment": decode_treatment(body.get("treatment")),
            **points,
        }
        self.state.intents[(app, key)] = intent
        return intent
