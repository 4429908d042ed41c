// Placeholder: tests of the shape ops
#include <gtest/gtest.h>
