// bench_learning's section 7 (learning_async.cc): asynchronous buffered aggregation (FedBuff) against synchronous
// FedAvg on digits over 100 workers of unequal speeds, in virtual time, with the targets as PASS/MISS lines.
#pragma once

#include "learning_digits.h"

namespace parsyn::bench {

// Prints the section; `quick`: a short horizon, to check the harness (the targets then mean little).
void AsyncVersusSync(const Digits& digits, bool quick);

}  // namespace parsyn::bench
