#include "edgeaccel/node/node_events.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "glog/logging.h"

namespace edgeaccel {
namespace {

constexpr char kComponent[] = "edgeaccel-device-plugin";
// Events about cluster-scoped objects go to "default", as client-go puts them.
constexpr char kEventsPath[] = "/api/v1/namespaces/default/events";

// RFC 3339 with seconds, as metav1.Time marshals.
std::string Rfc3339(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", t, absl::UTCTimeZone());
}

// The length of the well-formed UTF-8 character at the start of `s` (RFC 3629: no overlong
// forms, no surrogates, nothing past U+10FFFF), or 0 where there is none.
size_t Utf8CharLength(absl::string_view s) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const auto continuation = [&](size_t i, unsigned char low = 0x80, unsigned char high = 0xBF) {
    return i < s.size() && byte(i) >= low && byte(i) <= high;
  };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return continuation(1) ? 2 : 0;
  if (lead >= 0xE0 && lead <= 0xEF) {
    const unsigned char low = lead == 0xE0 ? 0xA0 : 0x80;
    const unsigned char high = lead == 0xED ? 0x9F : 0xBF;
    return continuation(1, low, high) && continuation(2) ? 3 : 0;
  }
  if (lead >= 0xF0 && lead <= 0xF4) {
    const unsigned char low = lead == 0xF0 ? 0x90 : 0x80;
    const unsigned char high = lead == 0xF4 ? 0x8F : 0xBF;
    return continuation(1, low, high) && continuation(2) && continuation(3) ? 4 : 0;
  }
  return 0;
}

// `text` with every byte that does not belong to a well-formed character replaced by U+FFFD, as
// Go's encoding/json writes client-go's strings: a device's sysfs text or a reason built from it
// may hold any bytes, and JSON holds only Unicode.
std::string ValidUtf8(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  while (!text.empty()) {
    const size_t length = Utf8CharLength(text);
    if (length == 0) {
      out += "\xEF\xBF\xBD";
      text.remove_prefix(1);
    } else {
      out.append(text.data(), length);
      text.remove_prefix(length);
    }
  }
  return out;
}

// client-go keeps a message to 1 KiB in events it aggregates; the API server's own limit on the
// whole note is larger, but a device's reason never needs more. The cut falls between characters
// ("°C" is two bytes): half a character is not UTF-8, and JSON cannot carry it.
std::string Bounded(const std::string& message) {
  std::string valid = ValidUtf8(message);
  if (valid.size() <= 1024) return valid;
  size_t cut = 1021;
  while (cut > 0 && (static_cast<unsigned char>(valid[cut]) & 0xC0) == 0x80) --cut;
  valid.resize(cut);
  return valid + "...";
}

// Never throws: the message is valid UTF-8 already (Bounded), and any other string that is not
// (a reason, the node's name) has its bad bytes replaced, where the default (strict) would throw
// type_error.316 out of the thread that sends events.
std::string Json(const nlohmann::json& object) {
  return object.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

std::string NodeEventObject(const NodeEvent& event, const std::string& node,
                            const std::string& name, int count, absl::Time first_seen,
                            absl::Time now) {
  nlohmann::json object = {
      {"apiVersion", "v1"},
      {"kind", "Event"},
      {"metadata", {{"name", name}, {"namespace", "default"}}},
      // The kubelet's node reference: uid is the node's name (pkg/kubelet: nodeRef).
      {"involvedObject", {{"kind", "Node"}, {"name", node}, {"uid", node}}},
      {"reason", event.reason},
      {"message", Bounded(event.message)},
      {"type", event.warning ? "Warning" : "Normal"},
      {"source", {{"component", kComponent}, {"host", node}}},
      {"reportingComponent", kComponent},
      {"reportingInstance", node},
      {"firstTimestamp", Rfc3339(first_seen)},
      {"lastTimestamp", Rfc3339(now)},
      {"count", count},
  };
  return Json(object);
}

NodeEventRecorder::NodeEventRecorder(ApiServerConfig config, Limits limits, Workers* worker)
    : config_(std::move(config)),
      limits_(limits),
      client_(config_),
      own_worker_(worker == nullptr ? std::make_unique<Workers>("ea-events") : nullptr),
      worker_(worker == nullptr ? own_worker_.get() : worker),
      tokens_(limits.spam_burst) {}

NodeEventRecorder::~NodeEventRecorder() { Stop(); }

void NodeEventRecorder::Start() {
  worker_->AddStopHook([this] { client_.Cancel(); });
  absl::MutexLock lock(&mu_);
  started_ = true;
  if (!queue_.empty()) Post();
}

void NodeEventRecorder::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    queue_.clear();
  }
  client_.Cancel();  // a request in flight ends now, whatever the API server does
  if (own_worker_ != nullptr) own_worker_->Stop();
}

void NodeEventRecorder::Record(NodeEvent event) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  if (queue_.size() >= limits_.queue) {
    queue_.pop_front();
    dropped_.fetch_add(1);
  }
  queue_.push_back(std::move(event));
  if (started_) Post();
}

void NodeEventRecorder::Post() {
  // One task drains the queue an event at a time; a post while it waits replaces it (the same
  // work), and each send posts the next, so other keys of a shared worker take their turns.
  worker_->Post("node events", [this] { SendNext(); });
}

void NodeEventRecorder::SendNext() {
  NodeEvent event;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ || queue_.empty()) return;
    event = std::move(queue_.front());
    queue_.pop_front();
  }
  // Nothing may end the process from here: an exception out of a worker's task is
  // std::terminate. None is expected (the bodies are built not to throw); one that comes
  // anyway (a bug, or no memory) costs this event, is counted as failed, and is said once.
  try {
    Send(event);
  } catch (const std::exception& e) {
    Unexpected(e.what());
  } catch (...) {
    Unexpected("an exception that is not a std::exception");
  }
  absl::MutexLock lock(&mu_);
  if (!stopping_ && !queue_.empty()) Post();
}

void NodeEventRecorder::Unexpected(const std::string& what) {
  failed_.fetch_add(1);
  if (said_.insert("exception").second) {
    LOG(ERROR) << "node " << config_.node_name << ": an event could not be recorded: " << what
               << " (a bug in edgeaccel; said once, counted as failed; devices are served as "
                  "before)";
  }
}

// A token bucket per Node (the one involved object), as client-go's spam filter keys on the
// source and the involved object.
bool NodeEventRecorder::TakeToken(absl::Time now) {
  if (tokens_at_ != absl::InfinitePast()) {
    tokens_ = std::min<double>(limits_.spam_burst,
                               tokens_ + (now - tokens_at_) / limits_.spam_refill);
  }
  tokens_at_ = now;
  if (tokens_ < 1) return false;
  tokens_ -= 1;
  return true;
}

std::string NodeEventRecorder::Key(const NodeEvent& event) {
  return absl::StrCat(event.warning ? "Warning" : "Normal", "\x1f", event.reason, "\x1f",
                      event.message);
}

void NodeEventRecorder::Fail(const std::string& why, const std::string& detail) {
  if (client_.cancelled()) return;  // Stop() cut the request short: not a failure
  failed_.fetch_add(1);
  if (said_.insert(why).second) {
    LOG(WARNING) << "cannot record events on node " << config_.node_name << ": " << detail
                 << " (said once; events are dropped, devices are served as before)";
  }
}

void NodeEventRecorder::Send(const NodeEvent& event) {
  const absl::Time now = absl::Now();
  if (!TakeToken(now)) {
    dropped_.fetch_add(1);
    if (said_.insert("spam").second) {
      LOG(WARNING) << "node " << config_.node_name << ": too many events (more than "
                   << limits_.spam_burst << ", then one per "
                   << absl::FormatDuration(limits_.spam_refill)
                   << "); dropping some, as the kubelet's recorder does (said once)";
    }
    return;
  }
  const std::string key = Key(event);
  auto it = seen_.find(key);
  if (it != seen_.end()) {
    // Seen before: one more of the same, on the Event that exists.
    Remembered& remembered = it->second.first;
    lru_.splice(lru_.begin(), lru_, it->second.second);
    nlohmann::json patch = {{"count", remembered.count + 1},
                            {"lastTimestamp", Rfc3339(now)},
                            {"message", Bounded(event.message)}};
    absl::StatusOr<HttpResponse> response =
        client_.Request("PATCH", absl::StrCat(kEventsPath, "/", remembered.name),
                        "application/strategic-merge-patch+json", Json(patch));
    if (response.ok() && response->status == 200) {
      remembered.count++;
      aggregated_.fetch_add(1);
      return;
    }
    if (!response.ok() || response->status != 404) {
      if (!response.ok()) {
        Fail("unreachable", std::string(response.status().message()));
      } else {
        Fail(absl::StrCat("HTTP ", response->status),
             absl::StrCat("PATCH event: HTTP ", response->status));
      }
      return;
    }
    // 404: the Event expired (1 h by default); record it anew.
    lru_.erase(it->second.second);
    seen_.erase(it);
  }
  const std::string name = absl::StrFormat("%s.%x", config_.node_name, absl::ToUnixNanos(now));
  absl::StatusOr<HttpResponse> response =
      client_.Request("POST", kEventsPath, "application/json",
                      NodeEventObject(event, config_.node_name, name, 1, now, now));
  if (!response.ok()) {
    Fail("unreachable", std::string(response.status().message()));
    return;
  }
  switch (response->status) {
    case 201:
    case 200:
      break;
    case 403:
      Fail("HTTP 403",
           "HTTP 403: the service account needs {apiGroups: [\"\"], resources: [\"events\"], "
           "verbs: [\"create\", \"patch\"]} in a (Cluster)Role for namespace default");
      return;
    case 422:
      Fail("HTTP 422", absl::StrCat("HTTP 422: the API server refused the Event as invalid: ",
                                    response->body.substr(0, 300)));
      return;
    case 429:
      Fail("HTTP 429", "HTTP 429: the API server is throttling us");
      return;
    default:
      Fail(absl::StrCat("HTTP ", response->status), absl::StrCat("POST event: HTTP ", response->status));
      return;
  }
  created_.fetch_add(1);
  lru_.push_front(key);
  seen_[key] = {Remembered{name, 1, now}, lru_.begin()};
  if (lru_.size() > limits_.remembered) {
    seen_.erase(lru_.back());
    lru_.pop_back();
  }
}

}  // namespace edgeaccel
