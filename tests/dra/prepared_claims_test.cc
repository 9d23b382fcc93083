#include <gtest/gtest.h>
TEST(Placeholder, prepared_claims) {}
