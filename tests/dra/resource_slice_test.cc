#include <gtest/gtest.h>
TEST(Placeholder, resource_slice) {}
