// bench_aggregate's section (g) (aggregate_lora.cc): peak RSS and time of aggregating LoRA adapters of different
// ranks, exactly in factored form against FedAvg of the same adapters zero-padded.
#pragma once

namespace parsyn::bench {

// The child process `self --lora fedavg|svd`: aggregates, prints "VmHWM_KiB seconds". Returns its exit code.
int LoraRanksChild(const char* mode);
// Runs both children and prints their figures side by side.
void LoraRanksSection(const char* self);

}  // namespace parsyn::bench
