// Unit test of the job form's strategies (node only): the form offers what the C++ strategy registry generated into
// training_defaults.js (STRATEGIES, src/coordinator/training_defaults_js.cc), each strategy with its options and their
// defaults as placeholders. PARSYN_TRAINING_DEFAULTS_JS names the generated file (tests/web/CMakeLists.txt).
import assert from 'node:assert/strict';
import path from 'node:path';
import test from 'node:test';
import { pathToFileURL } from 'node:url';

import { distributedFields, partitionFields, strategyChoices } from '../../web/app/new_job.js';

const generated = process.env.PARSYN_TRAINING_DEFAULTS_JS;

test('the generated strategies, their options and defaults', { skip: !generated && 'PARSYN_TRAINING_DEFAULTS_JS is not set' }, async () => {
  const { STRATEGIES } = await import(pathToFileURL(path.resolve(generated)).href);
  const { names, options, fields } = strategyChoices(STRATEGIES);
  assert.deepEqual(names, ['federated_averaging', 'fedprox', 'fedavgm', 'fedadam', 'fedyogi', 'fedadagrad', 'median',
    'trimmed_mean', 'krum', 'multi_krum', 'dp_fedavg']);
  assert.deepEqual(options, {
    federated_averaging: {},
    fedprox: { mu: '0.01' },
    fedavgm: { server_learning_rate: '1', server_momentum: '0.9' },
    fedadam: { server_learning_rate: '0.1', beta1: '0.9', beta2: '0.99', tau: '1e-9' },
    fedyogi: { server_learning_rate: '0.01', beta1: '0.9', beta2: '0.99', tau: '0.001' },
    fedadagrad: { server_learning_rate: '0.1', beta1: '0', tau: '1e-9' },
    median: {},
    trimmed_mean: { beta: '0.1' },
    krum: { f: '0' },
    multi_krum: { f: '0', m: 'n − f' },
    dp_fedavg: { clip_norm: 'required', noise_multiplier: '1', delta: '1e-5' },
  });
  assert.deepEqual(fields.map(([option, , kind]) => [option, kind]), [
    ['mu', 'number'], ['server_learning_rate', 'number'], ['server_momentum', 'number'], ['beta1', 'number'],
    ['beta2', 'number'], ['tau', 'number'], ['beta', 'number'], ['f', 'int'], ['m', 'int'], ['clip_norm', 'number'],
    ['noise_multiplier', 'number'], ['delta', 'number'], ['sample_fraction', 'number'], ['sample_count', 'int'],
  ]);
});

test('a strategy the form has no label for still shows, its options by name', () => {
  const { names, options, fields } = strategyChoices([
    { name: 'fedavg_plus', options: [{ name: 'mu', default: 0.5, required: false },
      { name: 'gamma', default: null, required: true }] },
  ]);
  assert.deepEqual(names, ['fedavg_plus']);
  assert.deepEqual(options, { fedavg_plus: { mu: '0.5', gamma: 'required' } });
  assert.deepEqual(fields.slice(0, 2), [['mu', 'μ (proximal term)', 'number'], ['gamma', 'gamma', 'number']]);
});

test('the distributed and partition fields show the generated defaults of a distributed job', { skip: !generated && 'PARSYN_TRAINING_DEFAULTS_JS is not set' }, async () => {
  const { DISTRIBUTED_DEFAULTS } = await import(pathToFileURL(path.resolve(generated)).href);
  const shown = (/** @type {any[]} */ rows) => Object.fromEntries(rows.map(([field, , , placeholder]) => [field, placeholder]));
  assert.deepEqual(shown(distributedFields(['federated_averaging', 'fedprox'], DISTRIBUTED_DEFAULTS)), {
    'distributed.enabled': false,
    'distributed.strategy': 'federated_averaging',
    'distributed.num_rounds': '10',
    'distributed.steps_per_round': '500',
    'distributed.min_workers': '2',
    'distributed.max_workers': 'min workers',
    'distributed.aggregation_timeout': '600',
    'distributed.fault_tolerance': '3',
    'distributed.join_window': '5',
  });
  assert.deepEqual(shown(partitionFields(DISTRIBUTED_DEFAULTS)), {
    'distributed.partition.method': 'iid',
    'distributed.partition.alpha': '0.5',
    'distributed.partition.classes_per_worker': '2',
    'distributed.partition.label': 'CSV: the label column',
  });
});
