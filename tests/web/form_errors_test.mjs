// Unit test of the job form's error placement: the server lists its problems by field (error.errors, {field,
// message}; src/coordinator/job_spec.h) and each goes to the form field its path names, without splitting messages.
import assert from 'node:assert/strict';
import test from 'node:test';

import { problemsByField } from '../../web/app/new_job.js';

const known = new Set(['name', 'dataset_id', 'config.lora_target_modules', 'distributed.min_workers',
  'distributed.max_workers', 'worker_selection.worker_ids']);

test('each problem goes to the field its path names', () => {
  const problems = [
    { field: 'distributed.min_workers', message: 'distributed.min_workers (3) must be <= distributed.max_workers (2)' },
    { field: 'dataset_id', message: 'dataset_id: dataset 9 does not exist' },
    { field: 'config.lora_target_modules[1]', message: 'config.lora_target_modules[1] must be a string, got number' },
  ];
  assert.deepEqual(problemsByField(problems, known), [
    { path: 'distributed.min_workers', message: 'distributed.min_workers (3) must be <= distributed.max_workers (2)' },
    { path: 'dataset_id', message: 'dataset_id: dataset 9 does not exist' },
    { path: 'config.lora_target_modules', message: 'config.lora_target_modules[1] must be a string, got number' },
  ]);
});

test('a message holding "; " stays whole', () => {
  const message = 'distributed.min_workers needs distributed.enabled true: one round; remove it or make the job distributed';
  assert.deepEqual(problemsByField([{ field: 'distributed.min_workers', message }], known),
    [{ path: 'distributed.min_workers', message }]);
});

test('unknown fields and unnamed problems stay with the form', () => {
  assert.deepEqual(problemsByField([
    { field: 'config.lerning_rate', message: 'unknown field config.lerning_rate' },
    { field: null, message: 'request body is not valid JSON' },
  ], known), [
    { path: null, message: 'unknown field config.lerning_rate' },
    { path: null, message: 'request body is not valid JSON' },
  ]);
});

test('a top-level field is found', () => {
  assert.deepEqual(problemsByField([{ field: 'name', message: "'name' must be 1..128 bytes" }], known), [
    { path: 'name', message: "'name' must be 1..128 bytes" },
  ]);
});
