// Placeholder: npy
#include <gtest/gtest.h>
