"""A tiny OIDC token issuer for Tela's FirecREST tests: the test's own identity provider.

Serves the client-credentials grant (RFC 6749 §4.4) on POST <prefix>/token, with the client id
and secret in the form (client_secret_post) or in HTTP Basic auth, and signs RS256 JWTs with
the RSA key FirecREST trusts (its JWKS is written by .ci/setup-firecrest.sh). Clients are read
from a JSON file on every request: {"<client id>": {"secret": "...", "user": "<unix user>",
"expires_in": 300}}. The token's `preferred_username` (FirecREST's usernameClaim) is that user.

    python idp.py --key key.pem --kid tela-ci --clients clients.json --listen 127.0.0.1:8079
"""

import argparse
import base64
import json
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--key", required=True)
    ap.add_argument("--kid", required=True)
    ap.add_argument("--clients", required=True)
    ap.add_argument("--listen", default="127.0.0.1:8079")
    args = ap.parse_args()
    key = open(args.key).read()
    host, port = args.listen.rsplit(":", 1)

    class Handler(BaseHTTPRequestHandler):
        def answer(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self.answer(200 if self.path == "/health" else 404, {"ok": self.path == "/health"})

        def do_POST(self):
            if not self.path.endswith("/token"):
                return self.answer(404, {"error": "not_found"})
            length = int(self.headers.get("Content-Length") or 0)
            form = urllib.parse.parse_qs(self.rfile.read(length).decode(), keep_blank_values=True)
            one = lambda k: (form.get(k) or [""])[0]
            client_id, secret = one("client_id"), one("client_secret")
            auth = self.headers.get("Authorization", "")
            if auth.startswith("Basic "):
                client_id, _, secret = base64.b64decode(auth[6:]).decode().partition(":")
                client_id, secret = urllib.parse.unquote_plus(client_id), urllib.parse.unquote_plus(secret)
            if one("grant_type") != "client_credentials":
                return self.answer(400, {"error": "unsupported_grant_type",
                                         "error_description": "only client_credentials is served"})
            clients = json.load(open(args.clients))
            client = clients.get(client_id)
            if client is None or client.get("secret") != secret:
                return self.answer(401, {"error": "invalid_client",
                                         "error_description": "unknown client or wrong secret"})
            now = int(time.time())
            lifetime = int(client.get("expires_in", 300))
            claims = {"iss": f"http://{args.listen}", "sub": client_id, "azp": client_id,
                      "preferred_username": client.get("user", client_id),
                      "iat": now, "nbf": now - 5, "exp": now + lifetime}
            token = jwt.encode(claims, key, algorithm="RS256", headers={"kid": args.kid})
            self.answer(200, {"access_token": token, "token_type": "Bearer", "expires_in": lifetime})

        def log_message(self, fmt, *a):
            pass

    ThreadingHTTPServer((host, int(port)), Handler).serve_forever()


if __name__ == "__main__":
    main()
