// Placeholder: tests of the reduction ops
#include <gtest/gtest.h>
