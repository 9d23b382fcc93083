#include <gtest/gtest.h>
TEST(Placeholder, claim_reader) {}
