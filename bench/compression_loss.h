// bench_compression's loss table (compression_loss.cc): per-round wire bytes and final validation loss of a small
// in-process FedAvg run per codec, for the demo's LoRA task and a full fine-tune of a small Llama. Built only where
// the trainer (libtorch) is.
#pragma once

namespace parsyn::bench {

struct LossTableOptions {
  bool quick = false;  // a few steps of tiny models: checks the harness, not the codecs
};

// Prints both tables to stdout; returns a process exit code (0 when every run completed, whatever the verdicts).
int PrintLossTables(const LossTableOptions& options);

}  // namespace parsyn::bench
