#include <gtest/gtest.h>
TEST(Placeholder, dra_driver) {}
