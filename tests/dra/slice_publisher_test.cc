#include <gtest/gtest.h>
TEST(Placeholder, slice_publisher) {}
