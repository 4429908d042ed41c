// Placeholder: tests of the registry ops
#include <gtest/gtest.h>
