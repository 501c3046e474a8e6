"""tests/support/oidc_provider.py, the OpenID Connect provider the sign-in tests run: started as a subprocess and
driven over HTTP with urllib only (no browser). ID tokens are checked the way a relying party does, with authlib.jose
against the provider's JWKS. Skipped only when authlib (Debian's python3-authlib) cannot be imported."""

import base64
import hashlib
import json
import secrets
import select
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

try:
    from authlib.jose import JsonWebKey, jwt
    from authlib.jose.errors import ExpiredTokenError, InvalidClaimError
    from authlib.oidc.core import CodeIDToken
except ImportError as error:
    raise unittest.SkipTest(f"authlib cannot be imported ({error}): install Debian's python3-authlib (./dev setup)")

PROVIDER = Path(__file__).resolve().parents[2] / "tests" / "support" / "oidc_provider.py"
DASHBOARD, CLI = "parsyn-dashboard", "parsyn-cli"
REDIRECT = "http://127.0.0.1:9/callback"  # never contacted: the provider's 302 is read, not followed
DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # a 302 then surfaces as an HTTPError, whose Location the test reads


OPENER = urllib.request.build_opener(NoRedirect)


class Forms(HTMLParser):
    """The forms of an HTML page: {form id: {"action", "method", "fields": {name: value}, "submit": bool}}."""

    def __init__(self, text):
        super().__init__()
        self.forms, self.current = {}, None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "form":
            self.current = self.forms[attrs.get("id")] = {"action": attrs.get("action"), "method": attrs.get("method"),
                                                          "fields": {}, "submit": False}
        elif tag == "input" and self.current is not None and attrs.get("name"):
            self.current["fields"][attrs["name"]] = attrs.get("value") or ""
        elif tag == "button" and self.current is not None and attrs.get("type") == "submit":
            self.current["submit"] = True

    def handle_endtag(self, tag):
        if tag == "form":
            self.current = None


def kid_of(token):
    """The kid in an ID token's header, read without verifying anything."""
    header = token["id_token"].split(".")[0]
    return json.loads(base64.urlsafe_b64decode(header + "=" * (-len(header) % 4)))["kid"]


def pkce_pair():
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    return verifier, challenge


class OidcProviderTest(unittest.TestCase):
    def setUp(self):
        self.stderr = self.enterContext(tempfile.TemporaryFile())
        self.proc = subprocess.Popen(
            [sys.executable, str(PROVIDER), "--port", "0", "--issuer-host", "127.0.0.1", "--client-id", DASHBOARD,
             "--client-id", CLI, "--user", "alice:wonderland:groups=team-a-owner,team-b-viewer",
             "--user", "bob:builder:groups="], stdout=subprocess.PIPE, stderr=self.stderr, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], 15)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.tearDown()
            self.stderr.seek(0)
            self.fail(f"the provider printed no first line; its stderr:\n{self.stderr.read().decode()}")
        started = json.loads(line)
        self.port, self.issuer = started["port"], started["issuer"]
        self.assertEqual(self.issuer, f"http://127.0.0.1:{self.port}")

    def tearDown(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()

    # ---- HTTP helpers ----

    def call(self, method, path, form=None, body=None, headers=None):
        """(status, headers, body text) of a request to the provider, whatever the status."""
        url = path if path.startswith("http") else self.issuer + path
        data = urllib.parse.urlencode(form).encode() if form is not None else body
        request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
        try:
            with OPENER.open(request, timeout=10) as response:
                return response.status, response.headers, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.headers, error.read().decode()

    def json_of(self, method, path, status=200, **kwargs):
        got, _, text = self.call(method, path, **kwargs)
        self.assertEqual(got, status, text)
        return json.loads(text)

    def jwks(self):
        return self.json_of("GET", "/jwks")

    # ---- the flows ----

    def authorize(self, client_id=DASHBOARD, username="alice", password="wonderland", nonce=None, challenge=None):
        """GET /authorize, then post its login form back as a browser would; returns the POST's response."""
        params = {"response_type": "code", "client_id": client_id, "redirect_uri": REDIRECT, "state": "st-123",
                  "scope": "openid profile email groups", "nonce": nonce or secrets.token_urlsafe(12),
                  "code_challenge": challenge, "code_challenge_method": "S256"}
        status, _, text = self.call("GET", "/authorize?" + urllib.parse.urlencode(params))
        self.assertEqual(status, 200, text)
        form = Forms(text).forms.get("login")
        self.assertIsNotNone(form, text)
        self.assertTrue(form["submit"], "the login form has no submit button")
        self.assertEqual(form["method"].lower(), "post")
        self.assertIn("username", form["fields"])
        self.assertIn("password", form["fields"])
        for name, value in params.items():  # the request travels in hidden fields
            self.assertEqual(form["fields"].get(name), value, name)
        fields = dict(form["fields"], username=username, password=password)
        return self.call("POST", urllib.parse.urljoin(self.issuer + "/authorize", form["action"]), form=fields)

    def sign_in(self, client_id=DASHBOARD, nonce=None):
        """The whole code flow with PKCE; returns (token response, nonce)."""
        nonce = nonce or secrets.token_urlsafe(12)
        verifier, challenge = pkce_pair()
        status, headers, text = self.authorize(client_id, nonce=nonce, challenge=challenge)
        self.assertEqual(status, 302, text)
        location = urllib.parse.urlsplit(headers["Location"])
        self.assertEqual(f"{location.scheme}://{location.netloc}{location.path}", REDIRECT)
        query = dict(urllib.parse.parse_qsl(location.query))
        self.assertEqual(query.get("state"), "st-123")
        self.assertIn("code", query, headers["Location"])
        token = self.json_of("POST", "/token", form={
            "grant_type": "authorization_code", "code": query["code"], "redirect_uri": REDIRECT,
            "client_id": client_id, "code_verifier": verifier})
        return token, nonce

    def decode(self, token, client_id=DASHBOARD, nonce=None):
        """The ID token's claims, checked as a relying party does: RS256 signature by a JWKS key, iss, aud, exp,
        nonce and at_hash. Raises what authlib raises when one of them is wrong."""
        claims = jwt.decode(token["id_token"], JsonWebKey.import_key_set(self.jwks()), claims_cls=CodeIDToken,
                            claims_options={"iss": {"essential": True, "value": self.issuer},
                                            "aud": {"essential": True, "value": client_id}},
                            claims_params={"nonce": nonce, "access_token": token["access_token"]})
        claims.validate()
        self.assertEqual(claims.header["alg"], "RS256")
        return claims

    # ---- the tests ----

    def test_discovery_names_every_endpoint_and_capability(self):
        d = self.json_of("GET", "/.well-known/openid-configuration")
        self.assertEqual(d["issuer"], self.issuer)
        for key, path in [("authorization_endpoint", "/authorize"), ("token_endpoint", "/token"),
                          ("jwks_uri", "/jwks"), ("device_authorization_endpoint", "/device_authorization"),
                          ("userinfo_endpoint", "/userinfo")]:
            self.assertEqual(d[key], self.issuer + path)
        self.assertEqual(d["response_types_supported"], ["code"])
        self.assertEqual(d["id_token_signing_alg_values_supported"], ["RS256"])
        self.assertEqual(d["code_challenge_methods_supported"], ["S256"])
        self.assertIn("public", d["subject_types_supported"])
        self.assertLessEqual({"authorization_code", DEVICE_GRANT}, set(d["grant_types_supported"]))
        self.assertLessEqual({"openid", "profile", "email", "groups"}, set(d["scopes_supported"]))

    def test_jwks_publishes_public_rsa_keys_with_kid(self):
        keys = self.jwks()["keys"]
        self.assertEqual(len(keys), 1)
        self.assertEqual(keys[0]["kty"], "RSA")
        self.assertTrue(keys[0].get("kid"))
        self.assertFalse({"d", "p", "q"} & set(keys[0]), "the JWKS leaks the private key")

    def test_code_flow_with_pkce_issues_a_verifiable_id_token(self):
        token, nonce = self.sign_in()
        self.assertEqual(token["token_type"].lower(), "bearer")
        self.assertGreater(token["expires_in"], 0)
        claims = self.decode(token, nonce=nonce)
        self.assertEqual(claims["sub"], "alice")
        self.assertEqual(claims["aud"], DASHBOARD)
        self.assertEqual(claims["nonce"], nonce)
        self.assertEqual(claims["groups"], ["team-a-owner", "team-b-viewer"])
        self.assertEqual(claims["email"], "alice@example.com")
        self.assertEqual(claims["name"], "alice")
        self.assertGreater(claims["exp"], time.time())
        self.assertLessEqual(abs(claims["iat"] - time.time()), 60)
        self.assertIn(claims.header["kid"], [k["kid"] for k in self.jwks()["keys"]])
        info = self.json_of("GET", "/userinfo", headers={"Authorization": "Bearer " + token["access_token"]})
        self.assertEqual((info["sub"], info["groups"]), ("alice", ["team-a-owner", "team-b-viewer"]))
        self.assertEqual(self.call("GET", "/userinfo", headers={"Authorization": "Bearer nope"})[0], 401)

    def test_user_without_groups_gets_an_empty_list_for_the_other_client(self):
        verifier, challenge = pkce_pair()
        status, headers, _ = self.authorize(CLI, username="bob", password="builder", challenge=challenge)
        self.assertEqual(status, 302)
        code = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(headers["Location"]).query))["code"]
        token = self.json_of("POST", "/token", form={"grant_type": "authorization_code", "code": code,
                                                     "redirect_uri": REDIRECT, "client_id": CLI,
                                                     "code_verifier": verifier})
        claims = self.decode(token, client_id=CLI)
        self.assertEqual((claims["sub"], claims["aud"], claims["groups"]), ("bob", CLI, []))

    def test_wrong_password_shows_the_form_again_without_a_code(self):
        status, headers, text = self.authorize(password="not-it", challenge=pkce_pair()[1])
        self.assertEqual(status, 401)
        self.assertNotIn("Location", headers)
        self.assertIn("Invalid username or password", text)
        self.assertIn("login", Forms(text).forms)

    def test_pkce_is_required_and_a_wrong_verifier_is_refused(self):
        params = {"response_type": "code", "client_id": DASHBOARD, "redirect_uri": REDIRECT, "scope": "openid",
                  "state": "s"}
        status, headers, _ = self.call("GET", "/authorize?" + urllib.parse.urlencode(params))
        self.assertEqual(status, 302)
        self.assertIn("error=invalid_request", headers["Location"])
        verifier, challenge = pkce_pair()
        status, headers, _ = self.authorize(challenge=challenge)
        code = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(headers["Location"]).query))["code"]
        exchange = {"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT,
                    "client_id": DASHBOARD}
        wrong = self.json_of("POST", "/token", status=400, form=dict(exchange, code_verifier=pkce_pair()[0]))
        self.assertEqual(wrong["error"], "invalid_grant")
        self.assertNotIn("id_token", wrong)
        self.assertEqual(self.json_of("POST", "/token", status=400, form=exchange)["error"], "invalid_request")
        self.json_of("POST", "/token", form=dict(exchange, code_verifier=verifier))
        reused = self.json_of("POST", "/token", status=400, form=dict(exchange, code_verifier=verifier))
        self.assertEqual(reused["error"], "invalid_grant")  # a code is good for one token

    def test_unregistered_client_and_foreign_redirect_are_not_redirected_to(self):
        for client_id, redirect in [("intruder", REDIRECT), (DASHBOARD, "https://evil.example/cb")]:
            params = {"response_type": "code", "client_id": client_id, "redirect_uri": redirect, "scope": "openid",
                      "code_challenge": pkce_pair()[1], "code_challenge_method": "S256"}
            status, headers, _ = self.call("GET", "/authorize?" + urllib.parse.urlencode(params))
            self.assertEqual(status, 400, client_id)
            self.assertNotIn("Location", headers)

    def test_device_flow(self):
        started = self.json_of("POST", "/device_authorization",
                               form={"client_id": CLI, "scope": "openid profile email groups"})
        self.assertEqual(started["verification_uri"], self.issuer + "/device")
        self.assertEqual(started["interval"], 1)
        self.assertGreater(started["expires_in"], 0)
        poll = {"grant_type": DEVICE_GRANT, "device_code": started["device_code"], "client_id": CLI}
        self.assertEqual(self.json_of("POST", "/token", status=400, form=poll)["error"], "authorization_pending")

        status, _, text = self.call("GET", started["verification_uri_complete"])
        self.assertEqual(status, 200)
        form = Forms(text).forms["device"]
        self.assertEqual(form["fields"]["user_code"], started["user_code"])
        approve = {"user_code": started["user_code"], "username": "alice", "password": "wrong"}
        self.assertEqual(self.call("POST", "/device", form=approve)[0], 401)
        self.assertEqual(self.call("POST", "/device", form=dict(approve, user_code="BCDF-GHJK"))[0], 400)
        self.assertEqual(self.json_of("POST", "/token", status=400, form=poll)["error"], "authorization_pending")
        self.assertEqual(self.call("POST", "/device", form=dict(approve, password="wonderland"))[0], 200)

        deadline = time.time() + 10
        while True:
            status, _, text = self.call("POST", "/token", form=poll)
            if status == 200 or time.time() > deadline:
                break
            self.assertEqual(json.loads(text)["error"], "authorization_pending")
            time.sleep(started["interval"])
        self.assertEqual(status, 200, text)
        claims = self.decode(json.loads(text), client_id=CLI)
        self.assertEqual((claims["sub"], claims["groups"]), ("alice", ["team-a-owner", "team-b-viewer"]))
        self.assertEqual(self.call("POST", "/token", form=poll)[0], 400)  # the device code is spent

    def test_key_rotation(self):
        before, nonce = self.sign_in()
        old_kid = self.decode(before, nonce=nonce).header["kid"]
        rotated = self.json_of("POST", "/test/rotate-keys")
        self.assertNotEqual(rotated["kid"], old_kid)
        self.assertEqual({k["kid"] for k in self.jwks()["keys"]}, {old_kid, rotated["kid"]})
        after, nonce = self.sign_in()
        self.assertEqual(self.decode(after, nonce=nonce).header["kid"], rotated["kid"])
        self.decode(before)  # the old key is still published: tokens it signed still verify

        dropped = self.json_of("POST", "/test/rotate-keys?drop_old=1")
        self.assertEqual([k["kid"] for k in self.jwks()["keys"]], [dropped["kid"]])
        with self.assertRaises(ValueError):  # kid no longer in the JWKS
            self.decode(after)
        latest, nonce = self.sign_in()
        self.assertEqual(self.decode(latest, nonce=nonce).header["kid"], dropped["kid"])

    def test_next_token_controls_make_one_bad_token_each(self):
        cases = [({"expires_in": -60}, ExpiredTokenError, "expired"),
                 ({"audience": "someone-else"}, InvalidClaimError, 'claim "aud"'),
                 ({"sign_with_unknown_key": True}, ValueError, "Invalid JSON Web Key Set")]
        for control, error, message in cases:
            with self.subTest(control=control):
                self.json_of("POST", "/test/next-token", body=json.dumps(control).encode(),
                             headers={"Content-Type": "application/json"})
                bad, nonce = self.sign_in()
                with self.assertRaisesRegex(error, message):
                    self.decode(bad, nonce=nonce)
                known = [k["kid"] for k in self.jwks()["keys"]]
                self.assertEqual(kid_of(bad) in known, "sign_with_unknown_key" not in control)
                good, nonce = self.sign_in()  # the control applied to one token only
                self.assertEqual(self.decode(good, nonce=nonce)["sub"], "alice")
        self.json_of("POST", "/test/next-token", status=400, body=b'{"bogus": 1}')

    def test_sigterm_stops_it_cleanly(self):
        self.proc.terminate()
        self.assertEqual(self.proc.wait(5), 0)


if __name__ == "__main__":
    unittest.main()
