// Placeholder: model loading
#include <gtest/gtest.h>
