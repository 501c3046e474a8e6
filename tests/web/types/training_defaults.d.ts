// The types of training_defaults.js, which the build generates from C++ (src/coordinator/training_defaults_js.cc) and
// embeds beside web/app (web/CMakeLists.txt). tsconfig.json's rootDirs lay this folder over web/app.

// A job config's defaults (protocol::TrainingConfig): numbers, strings, booleans and lists of them.
export declare const TRAINING_DEFAULTS: Readonly<Record<string, string | number | boolean | (string | number)[]>>;

// Every strategy with the options it takes and their defaults (coordinator::StrategyCatalogJson).
export interface StrategyOption {
  name: string;
  default: number | null;  // null: none (derived, as multi_krum's m, or required)
  required: boolean;
}
export interface Strategy {
  name: string;
  options: StrategyOption[];
}
export declare const STRATEGIES: readonly Strategy[];

// A distributed job's defaults (coordinator::DistributedDefaultsJson): durations in seconds.
export interface DistributedDefaults {
  strategy: string;
  num_rounds: number;
  steps_per_round: number;
  min_workers: number;
  aggregation_timeout: number;
  fault_tolerance: number;
  join_window: number;
  partition: { method: string; alpha: number; classes_per_worker: number };
}
export declare const DISTRIBUTED_DEFAULTS: Readonly<DistributedDefaults>;
