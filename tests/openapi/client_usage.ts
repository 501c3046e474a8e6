// What a user of the generated client writes: openapi-fetch over the types openapi-typescript generated from
// docs/openapi.yaml (client_test.mjs puts them beside this file as parsyn-api.ts). tsc --strict must accept every
// call below and refuse each spec marked @ts-expect-error, so the document's types are as strict as the server.
import createClient from 'openapi-fetch';

import type { components, paths } from './parsyn-api';

type JobSpec = components['schemas']['JobSpec'];
type Job = components['schemas']['Job'];

const api = createClient<paths>({ baseUrl: 'http://127.0.0.1:8080', headers: { Authorization: 'Bearer psk_example' } });

// Creates a job; answers its id and URL, or prints each problem beside its field.
export async function createJob(datasetId: number, modelId: number): Promise<{ id: number; location: string } | null> {
  const spec: JobSpec = {
    name: 'llama-lora',
    dataset_id: datasetId,
    model_id: modelId,
    config: { epochs: 1, use_peft: true, lora_target_modules: ['q_proj', 'v_proj'], mixed_precision: 'bf16', lr_scheduler: 'cosine' },
    distributed: { enabled: true, num_rounds: 3, min_workers: 2, aggregation_timeout: 120, early_stopping: { patience: 2, min_delta: 0.01 } },
    worker_selection: { mode: 'auto' },
    data: { source: 'platform' },
  };
  const { data, error, response } = await api.POST('/api/v1/training-jobs', { body: spec });
  if (error) {
    for (const problem of error.error.errors ?? []) console.log(problem.field ?? '(the form)', problem.message);
    return null;
  }
  const warnings: string[] = data.warnings ?? [];
  warnings.forEach((w) => console.log('warning:', w));
  return { id: data.id ?? 0, location: response.headers.get('Location') ?? '' };
}

// Every running job, page by page.
export async function runningJobs(): Promise<Job[]> {
  const jobs: Job[] = [];
  let cursor: string | undefined;
  do {
    const { data, error } = await api.GET('/api/v1/training-jobs', { params: { query: { status: 'running', limit: 100, cursor } } });
    if (error) throw new Error(error.error.message);
    jobs.push(...data.training_jobs);
    cursor = data.next_cursor ?? undefined;
  } while (cursor !== undefined);
  return jobs;
}

// One artifact's bytes; a name with '/' ("best/adapter_config.json") is one path parameter.
export async function artifact(jobId: number, name: string): Promise<Blob | undefined> {
  const { data } = await api.GET('/api/v1/training-jobs/{id}/artifacts/{name}', {
    params: { path: { id: jobId, name } },
    parseAs: 'blob',
  });
  return data;
}

// A worker's first call: its session and timings.
export async function hello(token: string): Promise<number | undefined> {
  const worker = createClient<paths>({ baseUrl: 'http://127.0.0.1:8080', headers: { Authorization: `Bearer ${token}` } });
  const { data } = await worker.POST('/api/v1/worker/hello', { body: { device: 'cpu', local_data: { format: 'jsonl', rows: 10 } } });
  return data?.heartbeat_interval_ms;
}

// The types hold the spec's rules: each of these is a compile error.
// @ts-expect-error distributed.num_rounds is an integer, not a string
const wrongType: JobSpec = { name: 'x', model_id: 1, distributed: { num_rounds: 'ten' } };
// @ts-expect-error config has no key lerning_rate
const unknownKey: JobSpec = { name: 'x', model_id: 1, config: { lerning_rate: 0.1 } };
// @ts-expect-error mixed_precision is one of no, bf16, fp16
const notAChoice: JobSpec = { name: 'x', model_id: 1, config: { mixed_precision: 'fp8' } };
// @ts-expect-error early_stopping needs patience
const missingPatience: JobSpec = { name: 'x', model_id: 1, distributed: { early_stopping: { min_delta: 0.1 } } };
// @ts-expect-error data.source is platform or workers
const wrongSource: JobSpec = { name: 'x', model_id: 1, data: { source: 'laptop' } };
export const refused = [wrongType, unknownKey, notAChoice, missingPatience, wrongSource];
