// edgeaccel-test-neighbour: another vendor's device plugin, built like NVIDIA's or Intel's
// (neighbour_plugin.h), as a program: for trying edgeaccel beside it on a real kubelet (the lab
// in docs/testing.md). It serves on DIR/SOCKET, registers RESOURCE with DIR/kubelet.sock, and
// takes commands on stdin, one per line:
//   unhealthy ID   a health event: ID turns Unhealthy (prints whether a stream took it)
//   status         prints whether it still serves, and how many sends failed
//   quit           stops (end of input too)
//   edgeaccel-test-neighbour nvidia|intel DIR SOCKET RESOURCE ID...
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "neighbour_plugin.h"

int main(int argc, char** argv) {
  using edgeaccel::testing::NeighbourKind;
  using edgeaccel::testing::NeighbourPlugin;
  const std::string kind = argc > 1 ? argv[1] : "";
  if (argc < 6 || (kind != "nvidia" && kind != "intel")) {
    std::cerr << "usage: edgeaccel-test-neighbour nvidia|intel DIR SOCKET RESOURCE ID...\n";
    return 2;
  }
  std::vector<std::string> ids(argv + 5, argv + argc);
  NeighbourPlugin plugin(kind == "nvidia" ? NeighbourKind::kNvidiaLike : NeighbourKind::kIntelLike,
                         argv[2], argv[3], argv[4], ids);
  if (absl::Status started = plugin.Start(); !started.ok()) {
    std::cerr << "edgeaccel-test-neighbour: " << started << "\n";
    return 1;
  }
  std::printf("serving %s on %s\n", argv[4], plugin.socket().c_str());
  std::fflush(stdout);
  for (std::string line; std::getline(std::cin, line);) {
    std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (words.empty()) continue;
    if (words[0] == "quit") break;
    if (words[0] == "unhealthy" && words.size() == 2) {
      std::printf("%s: %s\n", words[1].c_str(),
                  plugin.MarkUnhealthy(words[1]) ? "taken by a stream" : "NOT taken by any stream");
    } else if (words[0] == "status") {
      std::printf("serving: %s, failed sends: %d\n", plugin.serving() ? "yes" : "NO",
                  plugin.failed_sends());
    } else {
      std::printf("unknown command: %s\n", line.c_str());
    }
    std::fflush(stdout);
  }
  plugin.Stop();
  return 0;
}
