// Unit test of the job form's error placement: the server's InvalidArgument message is split into its problems and
// each goes to the field its path names (src/coordinator/job_spec.h shows the message format).
import assert from 'node:assert/strict';
import test from 'node:test';

import { problemsByField } from '../../web/app/new_job.js';

const known = new Set(['name', 'dataset_id', 'config.lora_target_modules', 'distributed.min_workers',
  'distributed.max_workers', 'worker_selection.worker_ids']);

test('each problem goes to the field its path names', () => {
  const message = 'distributed.min_workers (3) must be <= distributed.max_workers (2); ' +
    'dataset_id: dataset 9 does not exist; config.lora_target_modules[1] must be a string, got number';
  assert.deepEqual(problemsByField(message, known), [
    { path: 'distributed.min_workers', message: 'distributed.min_workers (3) must be <= distributed.max_workers (2)' },
    { path: 'dataset_id', message: 'dataset_id: dataset 9 does not exist' },
    { path: 'config.lora_target_modules', message: 'config.lora_target_modules[1] must be a string, got number' },
  ]);
});

test('unknown fields and unnamed problems stay with the form', () => {
  assert.deepEqual(problemsByField('unknown field config.lerning_rate; request body is not valid JSON', known), [
    { path: null, message: 'unknown field config.lerning_rate' },
    { path: null, message: 'request body is not valid JSON' },
  ]);
});

test('a quoted top-level name is found', () => {
  assert.deepEqual(problemsByField("'name' must be 1..128 bytes", known), [
    { path: 'name', message: "'name' must be 1..128 bytes" },
  ]);
});
