// Implementation in progress; see dataset.h.
#include "data/dataset.h"
