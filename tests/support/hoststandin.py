"""IMDSv2 and CloudWatch Logs as a Batch host's user data reaches them, in one HTTP server on this machine: for the
qualification's tests (tests/functional/test_qualify_host.py, the guest tier's qualification boots).

IMDS answers the instance's id and type, a role's credentials, the region and the domain; Logs keeps the streams and
events it is sent (CreateLogStream, PutLogEvents) and lists streams by prefix as DescribeLogStreams does (ordered by
name, with their creation times), so the fence cap's count runs against it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.support.loopback import Quiet, serving

TOKEN, ROLE = "imds-token-1", "iobatch-host-role"
CREDENTIALS = {"AccessKeyId": "ASIAEXAMPLEKEY000001", "SecretAccessKey": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
               "Token": "IQoJb3JpZ2luX2VjEXAMPLE//token=="}


@dataclass
class HostWorld:
    """What the stand-in serves and what it was sent."""

    instance_id: str = "i-0123456789abcdef0"
    instance_type: str = "m6i.2xlarge"
    streams: dict[str, int] = field(default_factory=dict)  # name -> creationTime (ms)
    events: list[tuple[str, str]] = field(default_factory=list)  # (stream, message)
    targets: list[str] = field(default_factory=list)  # X-Amz-Target of each Logs call, in order
    lock: threading.Lock = field(default_factory=threading.Lock)

    def meta(self) -> dict[str, str]:
        return {"instance-id": self.instance_id, "instance-type": self.instance_type,
                "iam/security-credentials/": ROLE,
                f"iam/security-credentials/{ROLE}": json.dumps({"Code": "Success", **CREDENTIALS}),
                "placement/region": "eu-west-1", "services/domain": "amazonaws.com"}

    def messages(self, prefix: str) -> list[dict[str, Any]]:
        """The JSON events posted to streams whose name starts with `prefix`."""
        return [json.loads(message) for stream, message in self.events if stream.startswith(prefix)]


def _handler(world: HostWorld) -> type[BaseHTTPRequestHandler]:
    class StandIn(Quiet):
        def _answer(self, code: int, body: str) -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_PUT(self) -> None:
            ok = self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
            self._answer(200, TOKEN) if ok else self._answer(400, "")

        def do_GET(self) -> None:
            path, meta = self.path.removeprefix("/latest/meta-data/"), world.meta()
            if self.headers.get("X-aws-ec2-metadata-token") != TOKEN:
                self._answer(401, "")
            else:
                self._answer(200, meta[path]) if path in meta else self._answer(404, "")

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
            action = self.headers.get("X-Amz-Target", "").rpartition(".")[2]
            with world.lock:
                world.targets.append(action)
                if action == "CreateLogStream":
                    world.streams.setdefault(body["logStreamName"], int(time.time() * 1000))
                    return self._answer(200, "{}")
                if action == "PutLogEvents":
                    world.events += [(body["logStreamName"], e["message"]) for e in body["logEvents"]]
                    return self._answer(200, "{}")
                if action == "DescribeLogStreams":
                    prefix = body.get("logStreamNamePrefix", "")
                    found = sorted((n, t) for n, t in world.streams.items() if n.startswith(prefix))
                    page = found[:int(body.get("limit", 50))]
                    answer: dict[str, Any] = {"logStreams": [{"logStreamName": n, "creationTime": t} for n, t in page]}
                    if len(found) > len(page):
                        answer["nextToken"] = "more"
                    return self._answer(200, json.dumps(answer))
            self._answer(400, json.dumps({"__type": "UnknownOperationException"}))

    return StandIn


@contextmanager
def host_stand_in(world: HostWorld, address: str = "127.0.0.1") -> Iterator[str]:
    """Serve `world` on `address` (a free port) for the block; yields the base URL."""
    with serving(_handler(world), address) as url:
        yield url
