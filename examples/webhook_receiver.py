"""A receiver of Toolgate's webhooks: checks the v2 signature and drops repeats by delivery id.

    TOOLGATE_WEBHOOK_SECRET=whsec_... python examples/webhook_receiver.py [port]

Each event is stored in SQLite (WEBHOOK_DATABASE, webhook_events.sqlite3) under its
Toolgate-Delivery id, which is unique: a repeat (a retry, or a replay inside the signature's
window) is answered 200 and stored once. Anything not signed with the secret is answered 401.
Put it behind TLS: Toolgate sends webhooks over https only.
"""

import hashlib
import hmac
import json
import os
import sqlite3
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def toolgate_signature_valid(
    secret: str, header: str, delivery_id: str, body: bytes, window: int = 300
) -> bool:
    """docs/webhooks.md's check of the v2 signature."""
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    if not fields.get("t", "").isdigit() or "v2" not in fields:
        return False
    signed = f"{fields['t']}.{delivery_id}.".encode() + body
    expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    fresh = abs(time.time() - int(fields["t"])) <= window
    return fresh and hmac.compare_digest(expected, fields["v2"])


def receiver(secret: str, database: str) -> type[BaseHTTPRequestHandler]:
    with sqlite3.connect(database) as db:
        db.execute(
            "CREATE TABLE IF NOT EXISTS event (delivery_id TEXT PRIMARY KEY, event TEXT, body TEXT)"
        )

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            delivery_id = self.headers.get("Toolgate-Delivery", "")
            signature = self.headers.get("Toolgate-Signature", "")
            if not delivery_id or not toolgate_signature_valid(
                secret, signature, delivery_id, body
            ):
                self._answer(401, {"stored": False})
                return
            event = json.loads(body)
            with sqlite3.connect(database) as db:
                stored = db.execute(
                    "INSERT INTO event VALUES (?, ?, ?) ON CONFLICT (delivery_id) DO NOTHING",
                    (delivery_id, event["event"], body.decode()),
                ).rowcount
            # Answer first; work on what is stored afterwards (a queue, a cron), not here.
            self._answer(200, {"stored": bool(stored)})

        def _answer(self, status: int, payload: dict[str, bool]) -> None:
            answer = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

    return Receiver


def main() -> int:
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8088
    handler = receiver(
        os.environ["TOOLGATE_WEBHOOK_SECRET"],
        os.environ.get("WEBHOOK_DATABASE", "webhook_events.sqlite3"),
    )
    print(f"Receiving Toolgate's webhooks on 127.0.0.1:{port}")
    ThreadingHTTPServer(("127.0.0.1", port), handler).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
