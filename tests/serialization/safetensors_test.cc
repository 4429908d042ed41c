// Placeholder: safetensors
#include <gtest/gtest.h>
