// edgeaccel-fixture: builds a fake host tree (the same one the tests use) and prints where it
// is, so that something outside the tests can point the daemon at it, e.g. scripts/images.sh
// running a container image with the tree mounted as /host. The caller removes the tree.
//   edgeaccel-fixture HOST...   HOST: coral-pcie coral-usb jetson-nano jetson-xavier-nx
//                                     jetson-agx-orin nvidia nvml
#include <cstdio>
#include <iostream>
#include <string>

#include "fixture_host.h"

int main(int argc, char** argv) {
  using edgeaccel::testing::FixtureHost;
  if (argc < 2) {
    std::cerr << "usage: edgeaccel-fixture HOST...  (coral-pcie coral-usb jetson-nano "
                 "jetson-xavier-nx jetson-agx-orin nvidia nvml)\n";
    return 2;
  }
  FixtureHost host;
  for (int i = 1; i < argc; ++i) {
    const std::string kind = argv[i];
    if (kind == "coral-pcie") {
      host.AddCoralPcie({.index = 0, .pci_address = "0000:03:00.0"});
      host.AddCoralPcie({.index = 1, .pci_address = "0000:04:00.0"});
    } else if (kind == "coral-usb") {
      host.AddCoralUsb({.port = "2-1", .bus = 2, .dev = 3, .firmware_loaded = true});
    } else if (kind == "jetson-nano") {
      host.AddJetson(FixtureHost::Jetson::kNanoR32);
    } else if (kind == "jetson-xavier-nx") {
      host.AddJetson(FixtureHost::Jetson::kXavierNxR35);
    } else if (kind == "jetson-agx-orin") {
      host.AddJetson(FixtureHost::Jetson::kAgxOrinR36);
    } else if (kind == "nvidia") {
      host.AddNvidiaGpu({});
    } else if (kind == "nvml") {
      // The fake NVML for that GPU, where a driver of either machine would put it.
      host.AddFakeNvml(
          "driver=580.159.04\ncuda=13000\ngpu uuid=GPU-3291dfa4-fcc4-0110-615b-c894a0d7c689 "
          "name=NVIDIA_L4 minor=0 memory_mib=22491 cc=8.9 mig=unsupported ecc=enabled "
          "temperature=41\n",
          "/usr/lib64/libnvidia-ml.so.1");
    } else {
      std::cerr << "edgeaccel-fixture: unknown host \"" << kind << "\"\n";
      return 2;
    }
  }
  host.Keep();
  std::printf("%s\n", host.root().c_str());
  return 0;
}
