// Placeholder: executor
#include <gtest/gtest.h>
