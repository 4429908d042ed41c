// Placeholder: tests of the nn ops
#include <gtest/gtest.h>
