// Placeholder: CLI end to end
#include <gtest/gtest.h>
