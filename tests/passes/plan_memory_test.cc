// Placeholder: memory planning
#include <gtest/gtest.h>
