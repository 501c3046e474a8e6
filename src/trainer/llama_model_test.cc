#include "trainer/llama_model.h"

#include <gtest/gtest.h>
