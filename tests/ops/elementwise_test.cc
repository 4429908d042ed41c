// Placeholder: tests of the elementwise ops
#include <gtest/gtest.h>
