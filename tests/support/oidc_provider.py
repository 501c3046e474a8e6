#!/usr/bin/env python3
"""A real OpenID Connect provider for Parsyn's sign-in tests. NOT for production: test use only.

The protocol logic is authlib's (Debian 12's python3-authlib 1.2), used through its framework-agnostic server classes:
  - authorization code grant ......... authlib.oauth2.rfc6749.grants.AuthorizationCodeGrant
  - PKCE (S256 only, required) ....... authlib.oauth2.rfc7636.CodeChallenge
  - device authorization grant ....... authlib.oauth2.rfc8628.DeviceAuthorizationEndpoint / DeviceCodeGrant
  - ID tokens (RS256, nonce, at_hash)  authlib.oidc.core.grants.OpenIDCode / OpenIDToken
  - /userinfo bearer check ........... authlib.oauth2.rfc6750.BearerTokenValidator + rfc6749.ResourceProtector
  - keys and JWKS .................... authlib.jose.JsonWebKey
This file is only the glue: Python's standard http.server (ThreadingHTTPServer, no Flask), in-memory storage, and
the HTML login / device pages. Every request is handled under one lock, so the in-memory state needs no more care.

Usage:
  oidc_provider.py --port 0 --issuer-host 127.0.0.1 --client-id parsyn-dashboard --client-id parsyn-cli \
      [--redirect-uri URI ...] --user alice:password:groups=team-a-owner,team-b-viewer [--user ...] [--state-dir DIR]
  --user NAME:PASSWORD[:groups=G1,G2][:email=E][:name=N]   (email defaults to NAME@example.com, name to NAME)
  --redirect-uri: when given, clients may only use these exact URIs; when not, any http URI on a loopback host
                  (127.0.0.1, localhost, [::1]) with any port is accepted (RFC 8252 loopback redirects).
  --state-dir:    the signing keys are kept in DIR/keys.json and reused on restart (otherwise new keys each start).
On start it prints one JSON line to stdout, {"issuer": "http://HOST:PORT", "port": PORT}, then serves until SIGTERM or
SIGINT. Access logs go to stderr. Clients are public (no secret, token_endpoint_auth_method "none").

Endpoints: /.well-known/openid-configuration, /jwks, /authorize (GET form, POST sign-in), /token, /userinfo,
/device_authorization, /device (GET form; POST user_code+username+password approves).
Test controls (for tests only; a real provider has nothing like them):
  POST /test/rotate-keys[?drop_old=1]  a new RSA key with a new kid signs from now on; the JWKS publishes it, and
                                       drop_old=1 removes every older key from the JWKS.
  POST /test/next-token  JSON {"expires_in": -60} | {"audience": "someone-else"} | {"sign_with_unknown_key": true}
                         (may be combined): the NEXT ID token issued is expired / for another audience / signed by a
                         key that is not in the JWKS. Applies once, then tokens are normal again.
"""

import argparse
import html
import json
import os
import re
import secrets
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import parse_qsl, urlsplit

# authlib refuses plain http outside "localhost"; this provider serves http on 127.0.0.1 for tests only.
os.environ.setdefault("AUTHLIB_INSECURE_TRANSPORT", "1")
try:
    import authlib  # noqa: F401
except ImportError:  # another python3 came first on PATH (pyenv, a venv): Debian's has python3-authlib
    if os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3") and os.path.exists("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3", *sys.argv])
    raise

from authlib.jose import JsonWebKey  # noqa: E402  (imports after the environment is set)
from authlib.oauth2 import OAuth2Error  # noqa: E402
from authlib.oauth2.rfc6749 import (AuthorizationServer, ClientMixin, HttpRequest, InvalidRequestError,  # noqa: E402
                                    OAuth2Request, ResourceProtector, grants, list_to_scope, scope_to_list)
from authlib.oauth2.rfc6750 import BearerTokenGenerator, BearerTokenValidator  # noqa: E402
from authlib.oauth2.rfc7636 import CodeChallenge  # noqa: E402
from authlib.oauth2.rfc8628 import (DEVICE_CODE_GRANT_TYPE, DeviceAuthorizationEndpoint,  # noqa: E402
                                    DeviceCodeGrant, DeviceCredentialDict)
from authlib.oidc.core import AuthorizationCodeMixin, UserInfo  # noqa: E402
from authlib.oidc.core.grants import OpenIDCode, OpenIDToken  # noqa: E402

SCOPES = ["openid", "profile", "email", "groups"]
TOKEN_LIFETIME_S = 3600
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}


# ---- in-memory models (the "database" authlib's classes ask for) -------------------------------------------------

@dataclass
class User:
    name: str
    password: str
    groups: list
    email: str
    display_name: str


@dataclass
class Client(ClientMixin):
    client_id: str
    redirect_uris: list  # empty: any loopback http URI

    def get_client_id(self):
        return self.client_id

    def get_default_redirect_uri(self):
        return self.redirect_uris[0] if self.redirect_uris else None

    def get_allowed_scope(self, scope):
        return list_to_scope([s for s in scope_to_list(scope) if s in SCOPES]) if scope else ""

    def check_redirect_uri(self, redirect_uri):
        if self.redirect_uris:
            return redirect_uri in self.redirect_uris
        url = urlsplit(redirect_uri)
        return url.scheme == "http" and url.username is None and url.hostname in LOOPBACK_HOSTS

    def check_client_secret(self, client_secret):
        return False  # public clients have no secret

    def check_endpoint_auth_method(self, method, endpoint):
        return method == "none"

    def check_response_type(self, response_type):
        return response_type == "code"

    def check_grant_type(self, grant_type):
        return grant_type in ("authorization_code", DEVICE_CODE_GRANT_TYPE)


class AuthorizationCode(SimpleNamespace, AuthorizationCodeMixin):
    """An issued code: code, client_id, redirect_uri, scope, user, nonce, auth_time, code_challenge,
    code_challenge_method (read by authlib's CodeChallenge) and expires_at."""

    def get_redirect_uri(self):
        return self.redirect_uri

    def get_scope(self):
        return self.scope

    def get_nonce(self):
        return self.nonce

    def get_auth_time(self):
        return self.auth_time


class AccessToken(SimpleNamespace):
    """An issued access token (user, scope, expires_at), with the methods BearerTokenValidator calls (/userinfo)."""

    def get_scope(self):
        return self.scope

    def is_expired(self):
        return self.expires_at < time.time()

    def is_revoked(self):
        return False


@dataclass
class Store:
    codes: dict = field(default_factory=dict)        # code -> AuthorizationCode
    nonces: set = field(default_factory=set)         # (client_id, nonce) seen in authorization requests
    devices: dict = field(default_factory=dict)      # device_code -> DeviceCredentialDict
    approvals: dict = field(default_factory=dict)    # user_code -> User who approved it
    tokens: dict = field(default_factory=dict)       # access_token -> AccessToken
    next_token: dict = field(default_factory=dict)   # the /test/next-token override for the next ID token


class Keys:
    """The RSA signing keys: the last one signs, all of them are in the JWKS. Kept in DIR/keys.json with --state-dir."""

    def __init__(self, state_dir):
        self.path = Path(state_dir) / "keys.json" if state_dir else None
        if self.path and self.path.exists():
            self.keys = [JsonWebKey.import_key(k) for k in json.loads(self.path.read_text())["keys"]]
        else:
            self.keys = [self.new_key()]
            self.save()

    @staticmethod
    def new_key(prefix="key"):
        return JsonWebKey.generate_key("RSA", 2048, {"kid": f"{prefix}-{secrets.token_hex(6)}"}, is_private=True)

    def save(self):
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps({"keys": [k.as_dict(is_private=True) for k in self.keys]}))

    @property
    def signing(self):
        return self.keys[-1]

    def rotate(self, drop_old):
        self.keys = [self.new_key()] if drop_old else self.keys + [self.new_key()]
        self.save()
        return self.signing.kid

    def jwks(self):
        return {"keys": [k.as_dict(use="sig", alg="RS256") for k in self.keys]}


# ---- authlib's grants and endpoints, with the storage hooks they require -----------------------------------------

class CodeGrant(grants.AuthorizationCodeGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = ["none"]  # public clients; PKCE protects the code

    def save_authorization_code(self, code, request):
        if request.data.get("nonce"):  # a nonce is good for one sign-in (OpenIDCode.exists_nonce refuses it again)
            self.server.store.nonces.add((request.client_id, request.data["nonce"]))
        self.server.store.codes[code] = AuthorizationCode(
            code=code, client_id=request.client.client_id, redirect_uri=request.redirect_uri, scope=request.scope,
            user=request.user, nonce=request.data.get("nonce"), auth_time=int(time.time()),
            code_challenge=request.data.get("code_challenge"),
            code_challenge_method=request.data.get("code_challenge_method"), expires_at=time.time() + 600)

    def query_authorization_code(self, code, client):
        item = self.server.store.codes.get(code)
        if item and item.client_id == client.client_id and item.expires_at > time.time():
            return item
        return None

    def delete_authorization_code(self, authorization_code):
        self.server.store.codes.pop(authorization_code.code, None)

    def authenticate_user(self, authorization_code):
        return authorization_code.user


class PkceS256(CodeChallenge):
    """authlib's PKCE check, but a code_challenge with method S256 is required in every authorization request."""
    SUPPORTED_CODE_CHALLENGE_METHOD = ["S256"]

    def validate_code_challenge(self, grant):
        data, state = grant.request.data, grant.request.state
        if not data.get("code_challenge"):
            raise InvalidRequestError('Missing "code_challenge": PKCE is required', state=state)
        if data.get("code_challenge_method") != "S256":
            raise InvalidRequestError('"code_challenge_method" must be S256', state=state)
        super().validate_code_challenge(grant)


class IdTokenClaims:
    """What the ID token holds (shared by the code and device grants): signing key, issuer, audience, lifetime and
    the user's claims; plus the one-shot /test/next-token override."""

    def get_jwt_config(self, grant):
        server = grant.server
        override, server.store.next_token = server.store.next_token, {}
        grant.request.id_token_override = override  # read by get_audiences, called right after this
        key = Keys.new_key("unknown") if override.get("sign_with_unknown_key") else server.keys.signing
        return {"key": key, "alg": "RS256", "iss": server.issuer,
                "exp": int(override.get("expires_in", TOKEN_LIFETIME_S))}

    def get_audiences(self, request):
        return getattr(request, "id_token_override", {}).get("audience", request.client.get_client_id())

    def generate_user_info(self, user, scope):
        return user_claims(user)


def user_claims(user):
    """The user's claims, in every ID token and in /userinfo (whatever the scope: the tests want them all)."""
    return UserInfo(sub=user.name, name=user.display_name, preferred_username=user.name, email=user.email,
                    email_verified=True, groups=list(user.groups))


class OpenIDCodeClaims(IdTokenClaims, OpenIDCode):
    def exists_nonce(self, nonce, request):
        return (request.client_id, nonce) in request.provider.store.nonces


class DeviceIdToken(IdTokenClaims, OpenIDToken):
    pass


class DeviceAuthorization(DeviceAuthorizationEndpoint):
    INTERVAL = 1  # seconds between polls: short, for tests
    EXPIRES_IN = 600

    def get_verification_uri(self):
        return self.server.issuer + "/device"

    def save_device_credential(self, client_id, scope, data):
        self.server.store.devices[data["device_code"]] = DeviceCredentialDict(
            client_id=client_id, scope=scope, expires_at=time.time() + self.EXPIRES_IN, **data)


class DeviceGrant(DeviceCodeGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = ["none"]

    def query_device_credential(self, device_code):
        return self.server.store.devices.get(device_code)

    def query_user_grant(self, user_code):
        user = self.server.store.approvals.get(user_code)
        return (user, True) if user else None

    def should_slow_down(self, credential):
        return False

    def create_token_response(self):
        response = super().create_token_response()
        self.server.store.devices.pop(self.request.credential["device_code"], None)  # one token per device code
        return response


class BearerValidator(BearerTokenValidator):
    def __init__(self, store):
        super().__init__()
        self.store = store

    def authenticate_token(self, token_string):
        return self.store.tokens.get(token_string)


class Provider(AuthorizationServer):
    """authlib's AuthorizationServer bound to this file's HTTP glue: requests arrive already as OAuth2Request and
    responses leave as (status, body, headers) tuples."""

    def __init__(self, issuer, clients, users, keys):
        super().__init__(scopes_supported=SCOPES)
        self.issuer, self.clients, self.users, self.keys, self.store = issuer, clients, users, keys, Store()
        self.register_token_generator("default", BearerTokenGenerator(
            lambda **_: secrets.token_urlsafe(32), expires_generator=TOKEN_LIFETIME_S))
        self.register_grant(CodeGrant, [PkceS256(required=True), OpenIDCodeClaims(require_nonce=False)])
        self.register_grant(DeviceGrant, [DeviceIdToken()])
        self.register_endpoint(DeviceAuthorization)
        self.resource_protector = ResourceProtector()
        self.resource_protector.register_token_validator(BearerValidator(self.store))

    def query_client(self, client_id):
        return self.clients.get(client_id)

    def save_token(self, token, request):
        self.store.tokens[token["access_token"]] = AccessToken(
            user=request.user, scope=token.get("scope", ""), expires_at=time.time() + token["expires_in"])

    def create_oauth2_request(self, request):
        request.provider = self  # lets the nonce check reach the store
        return request

    def send_signal(self, name, *args, **kwargs):
        pass

    def handle_response(self, status, body, headers):
        return status, body, headers

    def check_password(self, username, password):
        user = self.users.get(username or "")
        return user if user and secrets.compare_digest(user.password, password or "") else None


# ---- HTML pages ------------------------------------------------------------------------------------------------

PAGE = ('<!doctype html><html><head><meta charset="utf-8"><title>{title}</title></head>'
        '<body style="font-family:sans-serif;max-width:28em;margin:3em auto"><h1>{title}</h1>{body}</body></html>')


def page(status, title, body):
    return status, PAGE.format(title=html.escape(title), body=body), [("Content-Type", "text/html; charset=utf-8")]


def error_html(message):
    return f'<p id="error" role="alert" style="color:#b00">{html.escape(message)}</p>' if message else ""


def credential_inputs(autofocus_user=True):
    return ('<p><label>Username <input name="username" id="username" autocomplete="username"'
            f'{" autofocus" if autofocus_user else ""}></label></p>'
            '<p><label>Password <input name="password" id="password" type="password"'
            ' autocomplete="current-password"></label></p>')


def login_page(status, params, message=""):
    hidden = "".join(f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">'
                     for k, v in params.items() if k not in ("username", "password"))
    return page(status, "Sign in", f'<p>to <b>{html.escape(params.get("client_id", ""))}</b></p>'
                f'{error_html(message)}<form id="login" method="post" action="/authorize">{hidden}'
                f'{credential_inputs()}<button type="submit" id="submit">Sign in</button></form>')


def device_page(status, user_code="", message=""):
    return page(status, "Connect a device", f'{error_html(message)}<form id="device" method="post" action="/device">'
                '<p><label>Code <input name="user_code" id="user_code" value="'
                f'{html.escape(user_code)}"></label></p>{credential_inputs(bool(user_code))}'
                '<button type="submit" id="submit">Approve</button></form>')


# ---- HTTP glue ---------------------------------------------------------------------------------------------------

class Handler(BaseHTTPRequestHandler):
    server_version = "parsyn-test-oidc/1"

    def do_GET(self):
        """Every request: route by method and path, run the route under the lock, answer what it returns."""
        method, provider = self.command, self.server.provider
        url = urlsplit(self.path)
        route = ROUTES.get((method, url.path))
        try:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) if method == "POST" else b""
            if route is None:
                response = 404, {"error": "not_found"}, []
            else:
                with self.server.lock:
                    response = route(self, provider, url, body)
        except Exception:  # a bug here must show in the test's log, and answer rather than hang the client
            traceback.print_exc()
            response = 500, {"error": "server_error"}, []
        self.reply(*response)

    do_POST = do_GET

    def reply(self, status, body, headers):
        headers = list(headers)
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
            if not any(k.lower() == "content-type" for k, _ in headers):
                headers.append(("Content-Type", "application/json"))
        data = (body or "").encode()
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def oauth2_request(self, provider, method, body):
        form = dict(parse_qsl(body.decode(), keep_blank_values=True)) if body else {}
        return OAuth2Request(method, provider.issuer + self.path, body=form, headers=self.headers)


def discovery(handler, provider, url, body):
    i = provider.issuer
    return 200, {
        "issuer": i, "authorization_endpoint": i + "/authorize", "token_endpoint": i + "/token",
        "jwks_uri": i + "/jwks", "userinfo_endpoint": i + "/userinfo",
        "device_authorization_endpoint": i + "/device_authorization",
        "response_types_supported": ["code"], "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": ["RS256"], "code_challenge_methods_supported": ["S256"],
        "grant_types_supported": ["authorization_code", DEVICE_CODE_GRANT_TYPE],
        "token_endpoint_auth_methods_supported": ["none"], "scopes_supported": SCOPES,
        "claims_supported": ["iss", "sub", "aud", "exp", "iat", "auth_time", "nonce", "at_hash", "name",
                             "preferred_username", "email", "email_verified", "groups"],
    }, []


def jwks(handler, provider, url, body):
    return 200, provider.keys.jwks(), []


def authorize(handler, provider, url, body):
    """GET: validate the request (authlib) and show the login form. POST: check the password, then authlib issues
    the code and redirects (consent is implicit)."""
    request = handler.oauth2_request(provider, handler.command, body)
    try:
        provider.get_consent_grant(request)
    except OAuth2Error as error:
        if error.redirect_uri:  # authlib redirects the error back to a valid client redirect_uri
            return provider.handle_error_response(request, error)
        return page(400, "Invalid request", error_html(f"{error.error}: {error.description or ''}"))
    if handler.command == "GET":
        return login_page(200, request.args)
    user = provider.check_password(request.form.get("username"), request.form.get("password"))
    if not user:
        return login_page(401, request.form, "Invalid username or password.")
    return provider.create_authorization_response(request, grant_user=user)


def token(handler, provider, url, body):
    return provider.create_token_response(handler.oauth2_request(provider, "POST", body))


def device_authorization(handler, provider, url, body):
    return provider.create_endpoint_response("device_authorization", handler.oauth2_request(provider, "POST", body))


def device(handler, provider, url, body):
    """The verification page of the device flow: GET shows it, POST user_code+username+password approves."""
    if handler.command == "GET":
        return device_page(200, dict(parse_qsl(url.query)).get("user_code", ""))
    form = dict(parse_qsl(body.decode(), keep_blank_values=True))
    user_code = form.get("user_code", "").strip().upper()
    pending = [c for c in provider.store.devices.values() if c["user_code"] == user_code and not c.is_expired()]
    if not pending:
        return device_page(400, user_code, "Unknown or expired code.")
    user = provider.check_password(form.get("username"), form.get("password"))
    if not user:
        return device_page(401, user_code, "Invalid username or password.")
    provider.store.approvals[user_code] = user
    pending[0]["auth_time"] = int(time.time())
    return page(200, "Device connected", '<p id="approved">Approved. You can return to your device.</p>')


def userinfo(handler, provider, url, body):
    request = HttpRequest(handler.command, provider.issuer + handler.path, None, handler.headers)
    try:
        access = provider.resource_protector.validate_request(["openid"], request)
    except OAuth2Error as error:
        return error()
    return 200, dict(user_claims(access.user)), []


def rotate_keys(handler, provider, url, body):
    kid = provider.keys.rotate(drop_old=dict(parse_qsl(url.query)).get("drop_old") in ("1", "true"))
    return 200, {"kid": kid, "kids": [k.kid for k in provider.keys.keys]}, []


def next_token(handler, provider, url, body):
    try:
        override = json.loads(body or b"{}")
    except ValueError:
        override = None
    allowed = {"expires_in", "audience", "sign_with_unknown_key"}
    if not isinstance(override, dict) or not set(override) <= allowed:
        return 400, {"error": "invalid_request", "error_description": f"a JSON object with keys from {allowed}"}, []
    provider.store.next_token = override
    return 200, {"next_token": override}, []


ROUTES = {
    ("GET", "/.well-known/openid-configuration"): discovery,
    ("GET", "/jwks"): jwks,
    ("GET", "/authorize"): authorize, ("POST", "/authorize"): authorize,
    ("POST", "/token"): token,
    ("POST", "/device_authorization"): device_authorization,
    ("GET", "/device"): device, ("POST", "/device"): device,
    ("GET", "/userinfo"): userinfo, ("POST", "/userinfo"): userinfo,
    ("POST", "/test/rotate-keys"): rotate_keys,
    ("POST", "/test/next-token"): next_token,
}


def parse_user(spec):
    # Fields split at the ":" before "groups=", "email=" or "name=": a group may hold ":" ("vision:editor").
    name, password, *rest = spec.split(":", 2)
    extra = re.split(r":(?=(?:groups|email|name)=)", rest[0]) if rest else []
    fields = dict(e.split("=", 1) for e in extra)
    groups = [g for g in fields.get("groups", "").split(",") if g]
    return User(name, password, groups, fields.get("email", f"{name}@example.com"), fields.get("name", name))


def main():
    parser = argparse.ArgumentParser(description="OpenID Connect provider for Parsyn's tests (authlib)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--issuer-host", default="127.0.0.1")
    parser.add_argument("--client-id", action="append", required=True)
    parser.add_argument("--redirect-uri", action="append", default=[])
    parser.add_argument("--user", action="append", required=True, type=parse_user)
    parser.add_argument("--state-dir")
    args = parser.parse_args()

    http = ThreadingHTTPServer((args.issuer_host, args.port), Handler)
    http.lock = threading.Lock()
    port = http.server_address[1]
    issuer = f"http://{args.issuer_host}:{port}"
    clients = {c: Client(c, args.redirect_uri) for c in args.client_id}
    http.provider = Provider(issuer, clients, {u.name: u for u in args.user}, Keys(args.state_dir))

    for sig in (signal.SIGTERM, signal.SIGINT):  # SIGINT too when started in the background, where it is ignored
        signal.signal(sig, lambda *_: sys.exit(0))
    print(json.dumps({"issuer": issuer, "port": port}), flush=True)
    try:
        http.serve_forever()
    finally:
        http.server_close()


if __name__ == "__main__":
    main()
