// Placeholder: zoo
#include <gtest/gtest.h>
