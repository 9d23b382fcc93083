#include <gtest/gtest.h>
TEST(Placeholder, DraE2e) {}
