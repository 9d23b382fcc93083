#include <gtest/gtest.h>
TEST(Placeholder, dra_kubelet_double) {}
