// bench_learning's section 6 (learning_lora_ranks.cc): workers of different LoRA ranks, exact factored aggregation
// against zero-padding and against every worker at the lowest rank, with the targets as PASS/MISS lines.
#pragma once

namespace parsyn::bench {

// Prints the section; `quick`: few rounds and steps, to check the harness (the targets then mean little).
void MixedLoraRanks(bool quick);

}  // namespace parsyn::bench
