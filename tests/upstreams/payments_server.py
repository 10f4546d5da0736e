"""A small payments API that the upstream tests start in a process of its own: the edge that
Toolgate does not own.

    python -m tests.upstreams.payments_server --state FILE --token TOKEN [--ignore-idempotency]

prints `PORT <n>` once it listens. Its state (payments, refunds, the answers it gave under each
Idempotency-Key) is a JSON file written after every change, so that a server killed and started
again on the same file remembers what it did. `--ignore-idempotency` makes it the variant that
does not honour Idempotency-Key; `--openapi` serves another document than the reviewed one.
POST /_faults arms faults, each for the next N requests it applies to: lose_after_commit (refund,
then drop the connection unanswered), hang_after_commit (refund, then never answer), slow and
slow_write (a read or a refund sleeps `slow_seconds` first), malformed and malformed_write (its
answer is not JSON), wrong_schema and wrong_schema_write (JSON of another shape), server_error
(HTTP 503, nothing done), markup (a 422 whose message carries markup). GET /_state returns the
whole state.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

OPENAPI = Path(__file__).with_name("payments_openapi.json")
# The document it serves: the reviewed one, or (--openapi) a changed one.
served = {"openapi": OPENAPI}
SEED = {
    "PAY-1": {"customer_id": "cust-1", "amount_cents": 10_000, "currency": "BRL"},
    "PAY-2": {"customer_id": "cust-1", "amount_cents": 8_000, "currency": "USD"},
    "PAY-3": {"customer_id": "cust-2", "amount_cents": 5_000, "currency": "BRL"},
}
FAULTS = (
    "lose_after_commit",
    "hang_after_commit",
    "slow",
    "malformed",
    "wrong_schema",
    "server_error",
    "markup",
    "malformed_write",
    "wrong_schema_write",
    "slow_write",
)


class Payments:
    def __init__(self, path: Path, honours_key: bool, seed: int = 0, persist: bool = True) -> None:
        self.path = path
        self.persist = persist
        self.honours_key = honours_key
        self.lock = threading.Lock()
        self.faults: dict[str, int] = {}
        self.slow_seconds = 0.0
        if path.exists():
            self.state = json.loads(path.read_text())
        else:
            seeded = dict(SEED)
            for n in range(seed):
                # A benchmark's: room for many refunds each.
                seeded[f"PAY-{1000 + n}"] = {
                    "customer_id": f"cust-{n}",
                    "amount_cents": 10**12,
                    "currency": "BRL",
                }
            payments = {
                pid: {"payment_id": pid, **found, "refunded_cents": 0}
                for pid, found in seeded.items()
            }
            self.state = {
                "payments": payments,
                "refunds": [],
                "answers": {},
                # Refunds asked for, and those that got as far as being judged.
                "received": 0,
                "requests": 0,
            }
            self.save()

    def save(self) -> None:
        if not self.persist:
            return
        scratch = self.path.with_suffix(".tmp")
        scratch.write_text(json.dumps(self.state))
        scratch.replace(self.path)

    def apply(self, payment_id: str, body: dict[str, Any]) -> tuple[int, Any]:
        payment = self.state["payments"].get(payment_id)
        if payment is None:
            return 404, {"error": {"message": "no such payment"}}
        amount = body.get("amount_cents")
        if not isinstance(amount, int) or amount < 1:
            return 422, {"error": {"message": "amount_cents must be a positive integer"}}
        if body.get("currency") != payment["currency"]:
            return 422, {"error": {"message": "currency differs from the payment's"}}
        if payment["refunded_cents"] + amount > payment["amount_cents"]:
            return 422, {"error": {"message": "amount is more than what is refundable"}}
        payment["refunded_cents"] += amount
        refund = {
            "refund_id": f"RE-{len(self.state['refunds']) + 1}",
            "payment_id": payment_id,
            "amount_cents": amount,
            "currency": payment["currency"],
            "client_reference": str(body.get("client_reference", "")),
            "refunded_cents": payment["refunded_cents"],
        }
        self.state["refunds"].append(refund)
        return 201, refund

    def refund_once(
        self, key: str | None, payment_id: str, body: dict[str, Any]
    ) -> tuple[int, Any]:
        """A refund judged and made, or (under a key it answered before) that answer again."""
        with self.lock:
            self.state["requests"] += 1
            answered = self.state["answers"].get(key) if key else None
            if answered is not None:
                status, result = answered
            else:
                status, result = self.apply(payment_id, body)
                if key:
                    self.state["answers"][key] = [status, result]
            self.save()
        return int(status), result

    def fault(self, name: str) -> bool:
        with self.lock:
            left = self.faults.get(name, 0)
            if left <= 0:
                return False
            self.faults[name] = left - 1
            return True


def handler_for(payments: Payments, token: str) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # An answer goes out in one write, flushed after each request: in two, the second would
        # wait on the client's delayed acknowledgement, some 40 ms a request.
        wbufsize = 1 << 16
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            return

        def answer(self, status: int, body: Any, *, raw: bytes | None = None) -> None:
            data = raw if raw is not None else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def refuse(self, status: int, message: str) -> None:
            self.answer(status, {"error": {"message": message}})

        def authorised(self) -> bool:
            if self.headers.get("Authorization") != f"Bearer {token}":
                self.refuse(401, "missing or wrong credentials")
                return False
            return True

        def do_GET(self) -> None:
            if not self.authorised():
                return
            url = urlsplit(self.path)
            if url.path == "/openapi.json":
                self.answer(200, None, raw=served["openapi"].read_bytes())
                return
            if url.path == "/_state":
                with payments.lock:
                    self.answer(200, payments.state)
                return
            if payments.fault("slow"):
                time.sleep(payments.slow_seconds)
            if payments.fault("malformed"):
                self.answer(200, None, raw=b"{not json")
                return
            if payments.fault("server_error"):
                self.refuse(503, "try later")
                return
            found = re.fullmatch(r"/payments/([^/]+)", url.path)
            if found:
                with payments.lock:
                    payment = payments.state["payments"].get(found.group(1))
                if payment is None:
                    self.refuse(404, "no such payment")
                elif payments.fault("wrong_schema"):
                    self.answer(200, {"id": payment["payment_id"], "total": "lots"})
                else:
                    self.answer(200, payment)
                return
            if url.path == "/refunds":
                reference = parse_qs(url.query).get("client_reference", [""])[0]
                with payments.lock:
                    # How often it was asked for a write's effect by reference.
                    payments.state["lookups"] = payments.state.get("lookups", 0) + 1
                    payments.save()
                    refunds = [
                        r for r in payments.state["refunds"] if r["client_reference"] == reference
                    ]
                self.answer(200, {"refunds": refunds})
                return
            self.refuse(404, "no such path")

        def do_POST(self) -> None:
            if not self.authorised():
                return
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            url = urlsplit(self.path)
            if url.path == "/_faults":
                with payments.lock:
                    for name in FAULTS:
                        payments.faults[name] = int(body.get(name, 0))
                    payments.slow_seconds = float(body.get("slow_seconds", 0))
                self.answer(200, {"armed": payments.faults})
                return
            found = re.fullmatch(r"/payments/([^/]+)/refunds", url.path)
            if not found:
                self.refuse(404, "no such path")
                return
            self.refund(found.group(1), body)

        def refund(self, payment_id: str, body: dict[str, Any]) -> None:
            with payments.lock:
                payments.state["received"] += 1
                payments.save()
            if payments.fault("slow_write"):
                time.sleep(payments.slow_seconds)
            if payments.fault("server_error"):
                self.refuse(503, "try later")
                return
            if payments.fault("markup"):
                self.refuse(422, '<script>alert("x")</script> refused <b>now</b>')
                return
            key = self.headers.get("Idempotency-Key") if payments.honours_key else None
            status, result = payments.refund_once(key, payment_id, body)
            if status == 201 and payments.fault("lose_after_commit"):
                self.close_connection = True
                return
            if status == 201 and payments.fault("hang_after_commit"):
                time.sleep(3600)
            if status == 201 and payments.fault("malformed_write"):
                self.answer(201, None, raw=b"<html>oops")
                return
            if status == 201 and payments.fault("wrong_schema_write"):
                self.answer(201, {"ok": True})
                return
            self.answer(status, result)

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ignore-idempotency", action="store_true")
    parser.add_argument("--openapi", type=Path, default=OPENAPI)
    parser.add_argument("--seed-payments", type=int, default=0)
    # A benchmark's: the state in memory only, so that a long run does not time its file.
    parser.add_argument("--in-memory", action="store_true")
    options = parser.parse_args()
    served["openapi"] = options.openapi
    payments = Payments(
        options.state,
        honours_key=not options.ignore_idempotency,
        seed=options.seed_payments,
        persist=not options.in_memory,
    )
    server = ThreadingHTTPServer(("127.0.0.1", options.port), handler_for(payments, options.token))
    server.daemon_threads = True
    print(f"PORT {server.server_address[1]}", flush=True)
    sys.stdout.close()
    server.serve_forever()


if __name__ == "__main__":
    main()
