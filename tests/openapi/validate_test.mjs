// docs/openapi.yaml against a maintained validator (@apidevtools/swagger-parser: the OpenAPI 3.0 schema, every $ref
// resolved) and against the rules generated clients need: every operation has a unique operationId, every response
// with a body has a schema, and no path template holds a parameter that spans segments.
// Usage: node validate_test.mjs [PATH/TO/openapi.yaml]. Exits 77 (skipped) when node_modules is absent.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import test from 'node:test';
import { fileURLToPath } from 'node:url';
import { skipForMissingDependency } from '../missing_dependency.mjs';

const here = dirname(fileURLToPath(import.meta.url));
if (!existsSync(join(here, 'node_modules', '@apidevtools', 'swagger-parser'))) {
  skipForMissingDependency('tests/openapi/node_modules is missing (run ./dev setup)');
}
const { default: SwaggerParser } = await import('@apidevtools/swagger-parser');
const documentPath = process.argv[2] ?? join(here, '..', '..', 'docs', 'openapi.yaml');
const METHODS = ['get', 'put', 'post', 'delete', 'patch', 'head', 'options', 'trace'];

// [path, method, operation] for every operation, $refs left as they are.
function operations(api) {
  const out = [];
  for (const [path, item] of Object.entries(api.paths)) {
    for (const method of METHODS) if (item[method]) out.push([path, method, item[method]]);
  }
  return out;
}

test('the document is valid OpenAPI 3.0', async () => {
  const api = await SwaggerParser.validate(documentPath);
  assert.match(api.openapi, /^3\.0\./);
  assert.ok(Object.keys(api.paths).length > 20);
});

test('every operation has a unique operationId', async () => {
  const api = await SwaggerParser.parse(documentPath);
  const seen = new Map();
  for (const [path, method, op] of operations(api)) {
    assert.ok(op.operationId, `${method.toUpperCase()} ${path} has no operationId`);
    assert.match(op.operationId, /^[a-z][A-Za-z0-9]*$/, `${method.toUpperCase()} ${path}: operationId is not camelCase`);
    assert.ok(!seen.has(op.operationId), `operationId ${op.operationId} is used by ${seen.get(op.operationId)} too`);
    seen.set(op.operationId, `${method.toUpperCase()} ${path}`);
  }
});

test('every response with a body has a schema', async () => {
  const api = await SwaggerParser.dereference(documentPath);
  for (const [path, method, op] of operations(api)) {
    for (const [status, response] of Object.entries(op.responses)) {
      const where = `${method.toUpperCase()} ${path} ${status}`;
      if (status === '204' || status.startsWith('3')) {  // no content; a redirect: its Location
        assert.equal(response.content, undefined, `${where}: a ${status} has no body`);
        continue;
      }
      assert.ok(response.content, `${where} has no content`);
      for (const [type, media] of Object.entries(response.content)) {
        assert.ok(media.schema, `${where} ${type} has no schema`);
      }
    }
  }
});

test('path parameters fill one segment each', async () => {
  const api = await SwaggerParser.parse(documentPath);
  for (const path of Object.keys(api.paths)) {
    for (const segment of path.split('/')) {
      if (!segment.includes('{')) continue;
      assert.match(segment, /^\{[a-z_]+\}$/, `${path}: '${segment}' is not one whole-segment parameter`);
    }
  }
});

test('list operations page with limit and cursor and answer next_cursor', async () => {
  const api = await SwaggerParser.dereference(documentPath);
  const lists = ['listDatasets', 'listModels', 'listWorkers', 'listTrainingJobs', 'getTrainingJobMetrics'];
  const byId = new Map(operations(api).map(([path, method, op]) => [op.operationId, { path, method, op }]));
  for (const id of lists) {
    const { op } = byId.get(id);
    const names = op.parameters.map((p) => p.name);
    assert.ok(names.includes('limit') && names.includes('cursor'), `${id} parameters: ${names}`);
    const schema = op.responses['200'].content['application/json'].schema;
    assert.ok(schema.required.includes('next_cursor'), `${id} answers no next_cursor`);
    assert.equal(schema.properties.next_cursor.nullable, true, `${id}: next_cursor is not nullable`);
  }
});
