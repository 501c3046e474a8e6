// Browser test of the audit log page (#/audit), signing in with users' own keys, and the API keys page (#/keys): a
// real `parsyn server` (no workers) and Debian's chromium driven headless by playwright-core. Registrations and a
// refused key fill the log; the page lists the records newest first as GET /api/v1/audit gives them, pages on with
// "Older records", filters by outcome and actor, and names the key that signs the checkpoints. Then users' own keys
// sign in: one of no project is told so; a project's owner works in it (switcher, its workers, its members, its audit
// records); a platform admin's keys page makes a key that works, shows it once, and revokes it.
//
//   node audit_and_keys_test.mjs --parsyn build/src/cli/parsyn [--out SCREENSHOT_DIR]
//
// Exit status: 0 passed, 1 failed, 77 skipped (tests/web/node_modules absent: run ./dev setup).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { arg, Children, runTest, launchChromium, playwrightOrSkip, signIn, startServer, waitFor } from './harness.mjs';

const { chromium } = await playwrightOrSkip();
const PARSYN = path.resolve(arg('parsyn', 'build/src/cli/parsyn'));
const OUT = arg('out', null);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'parsyn-web-audit-'));
const children = new Children(PARSYN, tmp);

const seqsOf = (page) => page.locator('#audit-table tbody tr').evaluateAll((rows) => rows.map((r) => Number(r.dataset.seq)));

async function main() {
  // --audit-checkpoint-every 20: the log holds checkpoints too.
  const { base, key, call } = await startServer(children, path.join(tmp, 'server'), ['--audit-checkpoint-every', '20']);
  for (let i = 0; i < 55; ++i) await call('POST', '/workers', JSON.stringify({ name: `w${i}` }));
  const refused = await fetch(`${base}/api/v1/datasets`, { headers: { Authorization: 'Bearer psk_wrong', 'X-Request-Id': 'wrong-key-1' } });
  assert.equal(refused.status, 401);
  const all = await waitFor('the refused key in the log', async () => {
    const page = await call('GET', '/audit?order=desc&limit=1000');
    return page.records.some((r) => r.outcome === 'denied') && page.records;
  });
  const keyInfo = await call('GET', '/audit/key');

  const context = await launchChromium(chromium, tmp);
  try {
    const page = context.pages()[0] ?? await context.newPage();
    const pageErrors = [];
    page.on('pageerror', (e) => pageErrors.push(String(e)));
    await signIn(page, base, key);
    await page.click('nav a[data-nav="audit"]');
    await page.locator('h1', { hasText: 'Audit log' }).waitFor();
    await waitFor('the first page', async () => (await seqsOf(page)).length === 50);
    // Newest first, as the API gives them; then the older ones.
    assert.deepEqual(await seqsOf(page), all.slice(0, 50).map((r) => r.seq));
    await page.click('#audit-more');
    await waitFor('the second page', async () => (await seqsOf(page)).length === all.length);
    assert.deepEqual(await seqsOf(page), all.map((r) => r.seq));
    assert.equal(await page.locator('#audit-more').isHidden(), true);
    const checkpoints = all.filter((r) => r.action === 'audit.checkpoint');
    assert.ok(checkpoints.length >= 2, JSON.stringify(checkpoints));
    const cpRow = page.locator(`#audit-table tr[data-seq="${checkpoints[0].seq}"]`);
    assert.match(await cpRow.textContent(), new RegExp(`signs record ${checkpoints[0].checkpoint.seq} \\(key ${keyInfo.key_id}\\)`));
    assert.match(await page.locator('#audit-key').textContent(), new RegExp(keyInfo.key_id));
    // Each row's time is its record's, shown in local time (not the epoch).
    const firstTime = await page.locator('#audit-table tbody tr').first().locator('td').nth(1).getAttribute('title');
    assert.equal(firstTime, all[0].time);
    assert.ok(Math.abs(Date.parse(all[0].time) - Date.now()) < 3_600_000, all[0].time);
    if (OUT) {
      fs.mkdirSync(OUT, { recursive: true });
      await page.screenshot({ path: path.join(OUT, 'audit.png'), fullPage: true });
    }

    // Filters: the refused key alone, with its request id; then one worker's registration by the admin.
    await page.selectOption('#audit-outcome', 'denied');
    await page.click('.audit-filters button[type=submit]');
    await waitFor('the denied filter', async () => (await seqsOf(page)).length === 1);
    const denied = page.locator('#audit-table tbody tr');
    assert.equal(await denied.getAttribute('data-outcome'), 'denied');
    const text = await denied.textContent();
    assert.match(text, /anonymous/);
    assert.match(text, /GET \/api\/v1\/datasets/);
    assert.match(text, /wrong-key-1/);
    await page.selectOption('#audit-outcome', '');
    await page.fill('#audit-actor', 'admin');
    await page.fill('#audit-action', 'POST /api/v1/workers');
    await page.click('.audit-filters button[type=submit]');
    await waitFor('the admin filter', async () => (await seqsOf(page)).length === 50);
    assert.deepEqual(await seqsOf(page), all.filter((r) => r.actor === 'admin').slice(0, 50).map((r) => r.seq));
    await userKeysSignIn(context, base, call);
    assert.deepEqual(pageErrors, []);
    console.log(`audit page: ${all.length} records in two pages, ${checkpoints.length} checkpoints, filters by outcome and actor`);
  } finally {
    await context.close();
  }
}

// Users' own keys sign in. A user of no project is told so; made the owner of project vision, she works in it: the
// switcher names it, the workers page lists its workers only, the members page adds a member, and the audit log page
// shows the project's records. A platform admin's key then works everywhere, and her keys page is checked.
async function userKeysSignIn(context, base, call) {
  const alice = await call('POST', '/users', JSON.stringify({ name: 'alice', platform_admin: true }));
  const bob = await call('POST', '/users', JSON.stringify({ name: 'bob' }));
  await call('POST', '/users', JSON.stringify({ name: 'ed' }));
  const aliceKey = (await call('POST', '/keys', JSON.stringify({ name: 'browser', user_id: alice.id }))).key;
  const bobKey = (await call('POST', '/keys', JSON.stringify({ name: 'browser', user_id: bob.id }))).key;
  const page = await context.newPage();
  await page.goto(base);
  await page.fill('#api-key', 'puk_not-a-key');
  await page.keyboard.press('Enter');
  await waitFor('the wrong key', async () => /not accepted: invalid API key/.test(await page.locator('#sign-in-error').textContent()));
  await page.fill('#api-key', bobKey);
  await page.keyboard.press('Enter');
  await page.locator('#no-project').waitFor();
  assert.match(await page.locator('#no-project').textContent(), /not a member of any project/);
  await page.click('#sign-out');

  const vision = await call('POST', '/projects', JSON.stringify({ name: 'vision', owner: 'bob' }));
  const inVision = await fetch(`${base}/api/v1/workers`, { method: 'POST', body: JSON.stringify({ name: 'vision-gpu' }),
    headers: { Authorization: `Bearer ${aliceKey}`, 'X-Parsyn-Project': 'vision' } });
  assert.equal(inVision.status, 201, await inVision.text());
  await page.fill('#api-key', bobKey);
  await page.keyboard.press('Enter');
  await page.locator('h1', { hasText: 'Training' }).waitFor();
  assert.equal(await page.locator('#project-select').inputValue(), 'vision');
  await page.click('nav a[data-nav="workers"]');
  const workerNames = () => page.locator('#workers-table tbody tr td:nth-child(1)').allTextContents();
  await waitFor('vision\'s worker alone', async () => /^vision-gpu #\d+$/.test((await workerNames()).join()));
  await page.click('nav a[data-nav="members"]');
  await page.locator('h1', { hasText: 'Members of vision' }).waitFor();
  await page.fill('#member-user', 'ed');
  await page.selectOption('#member-role', 'editor');
  await page.click('#member-form button[type=submit]');
  await page.locator('#members-table tr[data-user="ed"][data-role="editor"]').waitFor();
  assert.deepEqual((await call('GET', `/projects/${vision.id}`)).members.map((m) => [m.name, m.role]),
    [['bob', 'owner'], ['ed', 'editor']]);
  page.once('dialog', (dialog) => dialog.accept());
  await page.click('#leave-project');  // the last owner: refused, saying so
  await waitFor('the refusal', async () => /last owner/.test(await page.locator('#members-error').textContent()));
  await page.click('nav a[data-nav="audit"]');
  await page.locator('h1', { hasText: 'Audit log of vision' }).waitFor();
  await waitFor('vision\'s records', async () => (await seqsOf(page)).length >= 2);
  const actions = await page.locator('#audit-table tbody tr td:nth-child(4)').allTextContents();
  assert.ok(actions.every((a) => /projects|workers/.test(a)), actions.join());
  await page.click('#sign-out');

  await page.fill('#api-key', aliceKey);
  await page.keyboard.press('Enter');
  await page.locator('h1', { hasText: 'Audit log' }).waitFor();  // where bob left off
  const options = await page.locator('#project-select option').allTextContents();
  assert.deepEqual(options, ['default (owner)', 'vision (owner)']);
  await keysPage(page, call, alice);
  await page.close();
}

// The API keys page: alice's keys as the API lists them; a new key shown once and working; a key revoked refused.
async function keysPage(page, call, alice) {
  await page.click('nav a[data-nav="keys"]');
  await page.locator('h1', { hasText: 'API keys' }).waitFor();
  const rowIds = () => page.locator('#keys-table tbody tr').evaluateAll((rows) => rows.map((r) => Number(r.dataset.keyId)));
  await waitFor('her key listed', async () => (await rowIds()).length === 1);
  await page.fill('#key-name', 'ci');
  await page.fill('#key-days', '30');
  await page.click('#key-form button[type=submit]');
  const made = await page.locator('#new-key-value').textContent();
  assert.match(made, /^puk_[0-9a-f]{64}$/);
  await waitFor('both keys listed', async () => (await rowIds()).length === 2);
  const listed = (await call('GET', `/keys?user_id=${alice.id}`)).keys;
  assert.deepEqual(await rowIds(), listed.map((k) => k.id));
  const ci = listed.find((k) => k.name === 'ci');
  assert.ok(Math.abs(ci.expires_at_ms - ci.created_at_ms - 30 * 86_400_000) < 1000, JSON.stringify(ci));
  const works = await fetch(new URL('/api/v1/workers', page.url()), { headers: { Authorization: `Bearer ${made}` } });
  assert.equal(works.status, 200);
  page.once('dialog', (dialog) => dialog.accept());
  await page.click(`#keys-table tr[data-key-id="${ci.id}"] button`);
  await waitFor('the key shown revoked', async () =>
    (await page.locator(`#keys-table tr[data-key-id="${ci.id}"]`).getAttribute('data-state')) === 'revoked');
  const refused = await fetch(new URL('/api/v1/workers', page.url()), { headers: { Authorization: `Bearer ${made}` } });
  assert.equal(refused.status, 401);
  assert.match(await refused.text(), /was revoked/);
  // A name the server refuses is said by the form.
  await page.fill('#key-name', 'x'.repeat(64));
  await page.fill('#key-days', '5000');
  await page.click('#key-form button[type=submit]');
  await waitFor('the refusal', async () => /expires_in_days/.test(await page.locator('#key-error').textContent()));
}

await runTest(main, children, tmp);
