// Browser test of single sign-on: a real OpenID Connect provider (tests/support/oidc_provider.py, on python3-authlib's
// server classes), a real `parsyn server --oidc-issuer ...` and Debian's chromium driven headless by playwright-core.
// The dashboard's sign-in offers the provider; its login page signs alice in (authorization code with PKCE), back on
// the dashboard with an HttpOnly, SameSite=Strict session cookie; a request that changes something without the CSRF
// header is refused, with it it passes; signing out revokes the session's key and clears the cookies.
//
//   node sso_sign_in_test.mjs --parsyn build/src/cli/parsyn --provider tests/support/oidc_provider.py
//
// Exit status: 0 passed, 1 failed, 77 skipped (tests/web/node_modules absent: run ./dev setup).
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';

import { arg, Children, runTest, launchChromium, playwrightOrSkip, startServer, waitFor } from './harness.mjs';

const { chromium } = await playwrightOrSkip();
const PARSYN = path.resolve(arg('parsyn', 'build/src/cli/parsyn'));
const PROVIDER = path.resolve(arg('provider', 'tests/support/oidc_provider.py'));
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'parsyn-web-sso-'));
const children = new Children(PARSYN, tmp);
let provider = null;

// The provider on a free port: its issuer URL, from the one line it prints.
async function startProvider() {
  provider = spawn('/usr/bin/python3', [PROVIDER, '--port', '0', '--issuer-host', '127.0.0.1', '--client-id',
    'parsyn-dashboard', '--user', 'alice:wonderland:groups=parsyn-admins'], { stdio: ['ignore', 'pipe', 'inherit'] });
  const lines = readline.createInterface({ input: provider.stdout });
  const first = await new Promise((resolve, reject) => {
    lines.once('line', resolve);
    provider.once('exit', (code) => reject(new Error(`the OIDC provider exited (${code}): is python3-authlib installed?`)));
  });
  return JSON.parse(first).issuer;
}

async function main() {
  const issuer = await startProvider();
  const { base, call } = await startServer(children, path.join(tmp, 'server'),
    ['--oidc-issuer', issuer, '--oidc-client-id', 'parsyn-dashboard', '--oidc-admin-group', 'parsyn-admins']);
  const context = await launchChromium(chromium, tmp);
  try {
    const page = context.pages()[0] ?? await context.newPage();
    const pageErrors = [];
    page.on('pageerror', (e) => pageErrors.push(String(e)));
    await page.goto(`${base}/#/keys`);
    const sso = page.locator('#sso-sign-in');
    await sso.waitFor();
    assert.match(await sso.textContent(), new RegExp(`Sign in with single sign-on \\(${issuer}\\)`));
    await sso.click();
    // The provider's own page: a wrong password first, then the right one.
    await page.waitForURL((url) => url.href.startsWith(issuer));
    await page.fill('#username', 'alice');
    await page.fill('#password', 'not-her-password');
    await page.click('#submit');
    await page.locator('#error').waitFor();
    await page.fill('#username', 'alice');
    await page.fill('#password', 'wonderland');
    await page.click('#submit');
    // Back where the sign-in started, signed in.
    await page.waitForURL(`${base}/#/keys`);
    await page.locator('h1', { hasText: 'API keys' }).waitFor();
    await waitFor('her session key listed', async () =>
      (await page.locator('#keys-table tbody tr').count()) === 1);
    assert.match(await page.locator('#keys-table tbody').textContent(), /dashboard sign-in/);

    const cookies = await context.cookies(base);
    const session = cookies.find((c) => c.name === 'parsyn_session');
    const csrf = cookies.find((c) => c.name === 'parsyn_csrf');
    assert.ok(session && csrf, JSON.stringify(cookies));
    assert.equal(session.httpOnly, true);
    assert.equal(session.sameSite, 'Strict');
    assert.equal(csrf.httpOnly, false);
    assert.match(session.value, /^puk_/);
    assert.ok(session.expires * 1000 - Date.now() > 11.9 * 3600_000, String(session.expires));

    // The page's own requests carry the CSRF token; one without it is refused and changes nothing.
    const withoutToken = await page.evaluate(async () => {
      const r = await fetch('/api/v1/keys', { method: 'POST', headers: { 'Content-Type': 'application/json' },
                                              body: JSON.stringify({ name: 'forged' }) });
      return { status: r.status, text: await r.text() };
    });
    assert.equal(withoutToken.status, 403);
    assert.match(withoutToken.text, /X-CSRF-Token/);
    await page.fill('#key-name', 'made-in-the-browser');
    await page.click('#key-form button[type=submit]');
    await page.locator('#new-key-value').waitFor();
    const alice = (await call('GET', '/users')).users.find((u) => u.name === 'alice');
    assert.equal(alice.platform_admin, true);
    const names = (await call('GET', `/keys?user_id=${alice.id}`)).keys.map((k) => k.name).sort();
    assert.deepEqual(names, ['dashboard sign-in', 'made-in-the-browser']);

    // The sign-in is in the audit log, under her name; the failed password never reached the coordinator.
    const signIns = (await call('GET', `/audit?action=${encodeURIComponent('GET /api/v1/auth/oidc/callback')}`)).records;
    assert.equal(signIns.length, 1, JSON.stringify(signIns));
    assert.equal(signIns[0].actor, 'alice');
    assert.equal(signIns[0].status, 302);
    assert.equal(signIns[0].outcome, 'success');
    // Signing out revokes the session's key and clears both cookies.
    await page.click('#sign-out');
    await page.locator('#api-key').waitFor();
    const after = await context.cookies(base);
    assert.equal(after.some((c) => c.name === 'parsyn_session' || c.name === 'parsyn_csrf'), false, JSON.stringify(after));
    const keys = (await call('GET', `/keys?user_id=${alice.id}`)).keys;
    assert.ok(keys.find((k) => k.name === 'dashboard sign-in').revoked_at_ms, JSON.stringify(keys));
    const stale = await fetch(`${base}/api/v1/keys`, { headers: { Cookie: `parsyn_session=${session.value}` } });
    assert.equal(stale.status, 401);
    assert.deepEqual(pageErrors, []);
    console.log('single sign-on: alice signed in through the provider, her session refused a request without its CSRF token, and ended at sign-out');
  } finally {
    await context.close();
  }
}

await runTest(main, children, tmp, () => provider?.kill('SIGTERM'));
