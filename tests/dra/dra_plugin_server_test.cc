#include <gtest/gtest.h>
TEST(Placeholder, dra_plugin_server) {}
