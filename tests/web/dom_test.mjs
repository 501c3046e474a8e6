// Unit test of the dashboard's coalesced runner (web/app/dom.js), node only, on node's mock clock: a burst of
// requests runs the task once, a steady stream of requests faster than the delay still runs it every delay (the job
// view re-reads its round history so while rounds end every 100 ms), and cancel stops a pending run.
import assert from 'node:assert/strict';
import test, { mock } from 'node:test';

import { coalescedRunner } from '../../web/app/dom.js';

test.beforeEach(() => mock.timers.enable({ apis: ['setTimeout'] }));
test.afterEach(() => mock.timers.reset());

test('a burst of requests runs the task once, after the delay from the first', () => {
  let runs = 0;
  const runner = coalescedRunner(() => { runs += 1; }, 200);
  for (let i = 0; i < 5; i += 1) runner.request();
  mock.timers.tick(199);
  assert.equal(runs, 0);
  mock.timers.tick(1);
  assert.equal(runs, 1);
  mock.timers.tick(1000);
  assert.equal(runs, 1, 'no request since: no run');
});

test('requests every 100 ms for 2 s with a 200 ms delay run the task every 200 ms, not never', () => {
  let runs = 0;
  const runner = coalescedRunner(() => { runs += 1; }, 200);
  for (let t = 0; t < 2000; t += 100) {
    runner.request();
    mock.timers.tick(100);
  }
  assert.equal(runs, 10);
});

test('a request after a run starts a new run', () => {
  let runs = 0;
  const runner = coalescedRunner(() => { runs += 1; }, 50);
  runner.request();
  mock.timers.tick(50);
  runner.request();
  mock.timers.tick(50);
  assert.equal(runs, 2);
});

test('cancel drops the pending run and the next request starts afresh', () => {
  let runs = 0;
  const runner = coalescedRunner(() => { runs += 1; }, 200);
  runner.request();
  mock.timers.tick(100);
  runner.cancel();
  mock.timers.tick(500);
  assert.equal(runs, 0);
  runner.request();
  mock.timers.tick(200);
  assert.equal(runs, 1);
});
