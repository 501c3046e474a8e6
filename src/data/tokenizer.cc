// Implementation in progress; see tokenizer.h.
#include "data/tokenizer.h"
