// edgeaccel-test-dra-kubelet: the tests' DRA kubelet double (tests/support/dra_kubelet.h) as a
// program, for a DRA driver running elsewhere (a container pointed at ROOT). It watches
// ROOT/plugins_registry as the kubelet of the generation named does and prints what it does
// (registrations, refusals, health stream messages) one line each, then:
//   watch [SECONDS]           keeps going until SIGINT/SIGTERM (or SECONDS); the default
//   prepare NS NAME UID...    waits for the driver, calls NodePrepareResources for the claims
//                             (NS NAME UID each), prints the answer as JSON on stdout
//   unprepare NS NAME UID...  the same with NodeUnprepareResources
// prepare/unprepare apply the kubelet's checks of the answer and exit 1 with its error (the
// plugin's raw answer is still printed when there was one). Events go to stderr then.
//   edgeaccel-test-dra-kubelet --root DIR [--generation 1.36|1.33] [--driver NAME]
//       [--timeout SECONDS] [--health-retry SECONDS] [--no-health] [COMMAND ...]
#include <signal.h>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "dra_kubelet.h"

namespace {

using ::edgeaccel::testing::DraKubelet;

constexpr char kUsage[] =
    "usage: edgeaccel-test-dra-kubelet --root DIR [--generation 1.36|1.33] [--driver NAME]\n"
    "           [--timeout SECONDS] [--health-retry SECONDS] [--no-health]\n"
    "           [watch [SECONDS] | prepare NS NAME UID... | unprepare NS NAME UID...]\n";

std::string Json(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string Json(const std::vector<std::string>& list) {
  std::string out = "[";
  for (size_t i = 0; i < list.size(); ++i) out += (i ? ", " : "") + Json(list[i]);
  return out + "]";
}

std::string Json(const std::string& driver, const DraKubelet::PrepareAnswer& answer) {
  std::string out = absl::StrCat("{\n  \"driver\": ", Json(driver), ",\n  \"service\": ",
                                 Json(answer.service), ",\n  \"endpoint\": ", Json(answer.endpoint),
                                 ",\n  \"claims\": {");
  bool first_claim = true;
  for (const auto& [uid, result] : answer.claims) {
    absl::StrAppend(&out, first_claim ? "\n" : ",\n", "    ", Json(uid), ": {\"error\": ",
                    Json(result.error), ", \"devices\": [");
    first_claim = false;
    for (size_t i = 0; i < result.devices.size(); ++i) {
      const DraKubelet::PreparedDevice& d = result.devices[i];
      absl::StrAppend(&out, i ? "," : "", "\n      {\"requestNames\": ", Json(d.request_names),
                      ", \"poolName\": ", Json(d.pool), ", \"deviceName\": ", Json(d.device),
                      ", \"cdiDeviceIDs\": ", Json(d.cdi_device_ids));
      if (d.share_id) absl::StrAppend(&out, ", \"shareID\": ", Json(*d.share_id));
      out += "}";
    }
    out += result.devices.empty() ? "]}" : "\n    ]}";
  }
  return out + (answer.claims.empty() ? "}\n}\n" : "\n  }\n}\n");
}

std::string Json(const std::string& driver, const DraKubelet::UnprepareAnswer& answer) {
  std::string out = absl::StrCat("{\n  \"driver\": ", Json(driver), ",\n  \"service\": ",
                                 Json(answer.service), ",\n  \"endpoint\": ", Json(answer.endpoint),
                                 ",\n  \"claims\": {");
  bool first = true;
  for (const auto& [uid, error] : answer.claims) {
    absl::StrAppend(&out, first ? "\n" : ",\n", "    ", Json(uid), ": {\"error\": ", Json(error),
                    "}");
    first = false;
  }
  return out + (answer.claims.empty() ? "}\n}\n" : "\n  }\n}\n");
}

bool Seconds(const char* text, absl::Duration* out) {
  double seconds;
  if (!absl::SimpleAtod(text, &seconds) || seconds < 0) return false;
  *out = absl::Seconds(seconds);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string root;
  std::string driver;
  absl::Duration timeout = absl::Seconds(30);
  edgeaccel::testing::DraKubeletOptions options;
  int i = 1;
  for (; i < argc && std::strncmp(argv[i], "--", 2) == 0; ++i) {
    const std::string flag = argv[i];
    const bool has_value = i + 1 < argc;
    if (flag == "--root" && has_value) {
      root = argv[++i];
    } else if (flag == "--driver" && has_value) {
      driver = argv[++i];
    } else if (flag == "--generation" && has_value) {
      auto generation = edgeaccel::testing::ParseDraKubeletGeneration(argv[++i]);
      if (!generation) {
        std::cerr << "edgeaccel-test-dra-kubelet: --generation is 1.36 (1.34-1.36) or 1.33 "
                     "(1.32-1.33), not " << argv[i] << "\n";
        return 2;
      }
      options.generation = *generation;
    } else if (flag == "--timeout" && has_value) {
      if (!Seconds(argv[++i], &timeout)) {
        std::cerr << kUsage;
        return 2;
      }
    } else if (flag == "--health-retry" && has_value) {
      if (!Seconds(argv[++i], &options.health_retry_interval)) {
        std::cerr << kUsage;
        return 2;
      }
    } else if (flag == "--no-health") {
      options.resource_health_status = false;
    } else {
      std::cerr << kUsage;
      return 2;
    }
  }
  const std::string command = i < argc ? argv[i++] : "watch";
  std::vector<DraKubelet::Claim> claims;
  absl::Duration watch_for = absl::InfiniteDuration();
  if (command == "prepare" || command == "unprepare") {
    if (i == argc || (argc - i) % 3 != 0) {
      std::cerr << kUsage;
      return 2;
    }
    for (; i < argc; i += 3) claims.push_back({argv[i], argv[i + 1], argv[i + 2]});
  } else if (command == "watch") {
    if (i < argc && !Seconds(argv[i++], &watch_for)) {
      std::cerr << kUsage;
      return 2;
    }
    if (i != argc) {
      std::cerr << kUsage;
      return 2;
    }
  } else {
    std::cerr << kUsage;
    return 2;
  }
  if (root.empty()) {
    std::cerr << kUsage;
    return 2;
  }

  // Signals are taken by this thread only (sigtimedwait below); the double's threads inherit
  // the blocked mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  FILE* event_out = command == "watch" ? stdout : stderr;
  DraKubelet kubelet(root, options);
  kubelet.OnEvent([event_out](const std::string& line) {
    std::fprintf(event_out, "%s %s\n", absl::FormatTime("%H:%M:%E3S", absl::Now(),
                                                         absl::LocalTimeZone()).c_str(),
                 line.c_str());
    std::fflush(event_out);
  });
  kubelet.Start();

  if (command == "watch") {
    const absl::Time end = absl::Now() + watch_for;
    while (absl::Now() < end) {
      const absl::Duration left = std::min(end - absl::Now(), absl::Seconds(1));
      struct timespec wait = absl::ToTimespec(left);
      if (sigtimedwait(&signals, nullptr, &wait) > 0) break;
    }
    kubelet.Stop();
    return 0;
  }

  // From here the double's threads print events too: an error goes out in one stdio call, as
  // each event does, so that no event line lands inside it (std::cerr writes each << apart).
  auto say_error = [](const std::string& text) {
    std::fputs(absl::StrCat("edgeaccel-test-dra-kubelet: ", text, "\n").c_str(), stderr);
    std::fflush(stderr);
  };
  if (driver.empty()) {
    // The first driver to register.
    kubelet.WaitFor([&] { return !kubelet.Drivers().empty(); }, timeout);
    std::vector<std::string> drivers = kubelet.Drivers();
    if (drivers.empty()) {
      std::string text = absl::StrCat("no DRA driver registered in ", absl::FormatDuration(timeout));
      for (const std::string& error : kubelet.registration_errors()) {
        absl::StrAppend(&text, "\n  ", error);
      }
      say_error(text);
      return 1;
    }
    driver = drivers.front();
  }
  absl::StatusOr<DraKubelet::Registration> registration =
      kubelet.WaitForRegistration(driver, timeout);
  if (!registration.ok()) {
    say_error(std::string(registration.status().message()));
    return 1;
  }
  int rc = 0;
  if (command == "prepare") {
    absl::StatusOr<DraKubelet::PrepareAnswer> raw =
        kubelet.CallNodePrepareResources(driver, claims);
    if (raw.ok()) std::fputs(Json(driver, *raw).c_str(), stdout);
    absl::Status checked = raw.ok() ? DraKubelet::CheckPrepareAnswer(claims, *raw) : raw.status();
    if (!checked.ok()) {
      say_error(std::string(checked.message()));
      rc = 1;
    }
  } else {
    absl::StatusOr<DraKubelet::UnprepareAnswer> raw =
        kubelet.CallNodeUnprepareResources(driver, claims);
    if (raw.ok()) std::fputs(Json(driver, *raw).c_str(), stdout);
    absl::Status checked =
        raw.ok() ? DraKubelet::CheckUnprepareAnswer(claims, *raw) : raw.status();
    if (!checked.ok()) {
      say_error(std::string(checked.message()));
      rc = 1;
    }
  }
  std::fflush(stdout);
  kubelet.Stop();
  return rc;
}
