#include <gtest/gtest.h>
TEST(Placeholder, api_resources) {}
