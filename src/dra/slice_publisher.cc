#include "edgeaccel/dra/slice_publisher.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <random>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "edgeaccel/dra/resource_slice.h"
#include "edgeaccel/host/backoff.h"
#include "edgeaccel/host/json_fields.h"
#include "glog/logging.h"

namespace edgeaccel {
namespace {

using nlohmann::json;

constexpr char kSlicesPath[] = "/apis/resource.k8s.io/v1/resourceslices";
constexpr int kConflictRetries = 5;

std::string UrlEncode(absl::string_view text) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// The message of a metav1.Status answer, or the start of the body.
std::string ApiMessage(const HttpResponse& response) {
  json body = json::parse(response.body, nullptr, false);
  return JsonString(body, "message").value_or(response.body.substr(0, 200));
}

absl::Status HttpError(absl::string_view what, const HttpResponse& response) {
  return absl::UnavailableError(absl::StrCat(what, ": the API server answered ", response.status, ": ",
                                             ApiMessage(response)));
}

bool HasTaints(const json& device) {
  const json* taints = JsonMember(device, "taints");
  return taints != nullptr && taints->is_array() && !taints->empty();
}

const json* DeviceNamed(const json* devices, const std::string& name) {
  if (devices == nullptr || !devices->is_array()) return nullptr;
  for (const json& device : *devices) {
    if (JsonString(device, "name") == name) return &device;
  }
  return nullptr;
}

// The API server sets timeAdded on a taint that has none (the DeviceTaint field's contract in
// k8s.io/api resource/v1 types.go: "added automatically during create or update if not set").
// A taint we still want (same device, key, value and effect) keeps the time it was added, so it
// is no difference from what is stored.
void KeepTimeAdded(const json* stored_devices, json* devices) {
  for (json& device : *devices) {
    if (!HasTaints(device)) continue;
    const json* stored = DeviceNamed(stored_devices, device["name"].get<std::string>());
    if (stored == nullptr || !HasTaints(*stored)) continue;
    for (json& taint : device["taints"]) {
      for (const json& old : (*stored)["taints"]) {
        // The stored side is the API server's answer: read without throwing on odd types.
        if (old.is_object() && JsonString(old, "key") == JsonString(taint, "key") &&
            JsonString(old, "value") == JsonString(taint, "value") &&
            JsonString(old, "effect") == JsonString(taint, "effect") && old.contains("timeAdded")) {
          taint["timeAdded"] = old["timeAdded"];
          break;
        }
      }
    }
  }
}

// True when we sent taints and the slice the API server answered with has none of them.
bool TaintsDropped(const json& sent_devices, const std::string& answer_body) {
  json answer = json::parse(answer_body, nullptr, false);
  const json* spec = JsonMember(answer, "spec");
  const json* answered = spec == nullptr ? nullptr : JsonMember(*spec, "devices");
  bool sent = false;
  for (const json& device : sent_devices) {
    if (!HasTaints(device)) continue;
    sent = true;
    const json* back = DeviceNamed(answered, device["name"].get<std::string>());
    if (back != nullptr && HasTaints(*back)) return false;
  }
  return sent;
}

// A 422 whose causes name a device's taints (an API server that validates them differently).
bool TaintsRefused(const json& sent_devices, const HttpResponse& response) {
  if (response.status != 422) return false;
  bool sent = false;
  for (const json& device : sent_devices) sent = sent || HasTaints(device);
  return sent && response.body.find(".taints") != std::string::npos;
}

}  // namespace

// What every watch event says at its head: its type, its object and the object's metadata (each
// nullptr where absent) and resourceVersion ("" where absent).
struct WatchEventHead {
  std::string type;
  const json* object = nullptr;
  const json* metadata = nullptr;
  std::string version;
};

WatchEventHead HeadOf(const json& event) {
  WatchEventHead head;
  head.type = JsonString(event, "type").value_or("");
  head.object = JsonMember(event, "object");
  head.metadata = head.object == nullptr ? nullptr : JsonMember(*head.object, "metadata");
  if (head.metadata != nullptr) head.version = JsonString(*head.metadata, "resourceVersion").value_or("");
  return head;
}

// True unless `version` is known to be no newer than `known`. Versions are compared as the
// integers kube-apiserver makes them (etcd revisions; KEP-5504 makes them comparable), and any
// version that is not one counts as newer.
bool NewerVersion(const std::string& version, const std::string& known) {
  uint64_t a = 0, b = 0;
  if (!absl::SimpleAtoi(version, &a) || !absl::SimpleAtoi(known, &b)) return version != known;
  return a > b;
}

std::string SliceFieldSelector(absl::string_view driver, absl::string_view node_name) {
  return UrlEncode(absl::StrCat("spec.driver=", driver, ",spec.nodeName=", node_name));
}

SlicePublisher::SlicePublisher(Options options, const ApiClient* client, DeviceSet* set)
    : options_(std::move(options)),
      client_(client),
      set_(set),
      wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      short_watches_(options_.initial_backoff, options_.max_backoff, 0.2) {}

SlicePublisher::~SlicePublisher() {
  Stop();
  if (wake_fd_ >= 0) close(wake_fd_);
}

void SlicePublisher::Wake() {
  const uint64_t one = 1;
  if (wake_fd_ >= 0 && write(wake_fd_, &one, sizeof(one)) < 0) {
    // Only a counter at its maximum fails, and then it is signalled already.
  }
}

void SlicePublisher::PostSync() {
  worker_.PostRetrying("sync", [this] { return Sync(); },
                       {.first = options_.initial_backoff,
                        .max = options_.max_backoff,
                        .jitter = 0.2,
                        // A change is tried at once, also while a failure's retry waits.
                        .newer_waits_for_retry = false});
}

void SlicePublisher::Start() {
  if (loop_ != nullptr) return;
  // A slice carries facts (compute capability, memory): a change of facts alone publishes too.
  listener_ = set_->Subscribe(
      [this](std::shared_ptr<const Snapshot>) {
        {
          absl::MutexLock lock(&mu_);
          dirty_ = true;
        }
        PostSync();
      },
      DeviceSet::Changes::kAdvertisedOrFacts);
  next_chore_ = options_.chore ? absl::Now() : absl::InfiniteFuture();
  loop_ = options_.loop;
  if (loop_ == nullptr) {
    own_loop_ = std::make_unique<PollLoop>("ea-dra-watch");
    loop_ = own_loop_.get();
  }
  loop_->Add(this);
  PostSync();
}

void SlicePublisher::Stop() {
  if (listener_ != 0) {
    set_->Unsubscribe(listener_);
    listener_ = 0;
  }
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (loop_ != nullptr) {
    loop_->Remove(this);
    loop_ = nullptr;
  }
  worker_.Stop();  // waits for a sync under way: its request ends at the client's Cancel
  own_loop_.reset();
  watch_ = {};
  absl::MutexLock lock(&mu_);
  opened_ = {};
}

void SlicePublisher::Resync() {
  {
    absl::MutexLock lock(&mu_);
    dirty_ = true;
    relist_ = true;
  }
  PostSync();
}

SlicePublisher::Status SlicePublisher::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

PollLoop::Fds SlicePublisher::WaitFds() {
  return {wake_fd_, watch_.stream != nullptr ? watch_.stream->fd() : -1, -1, -1};
}

absl::Time SlicePublisher::Step(const PollLoop::Events& ready) {
  if (ready[0] != 0) {
    uint64_t count;
    if (read(wake_fd_, &count, sizeof(count)) < 0) {
      // EAGAIN: nothing to take; the state below says what changed.
    }
  }
  // ready[1] is the socket of the watch_ polled: read it before a newer one replaces it.
  if (watch_.stream != nullptr && ready[1] != 0) ReadWatch();
  bool sync = false;
  absl::Time next = absl::InfiniteFuture();
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::InfiniteFuture();
    if (opened_.stream != nullptr) {
      watch_ = std::exchange(opened_, {});
    } else if (watch_.stream != nullptr && watch_.id != stream_id_) {
      watch_ = {};  // the worker dropped it (a new list)
    }
    if (watch_.stream != nullptr && absl::Now() >= watch_.deadline) {
      // The server did not end it when asked: as if it had, another one from where we are.
      watch_ = {};
      stream_open_ = false;
      HttpResponse renewed;
      renewed.status = 200;
      stream_end_ = renewed;
      sync = true;
    }
    if (absl::Now() >= reopen_at_) {
      reopen_at_ = absl::InfiniteFuture();  // after a watch ended at once: the next one now
      sync = true;
    }
    if (absl::Now() >= next_list_) {
      next_list_ = absl::InfiniteFuture();  // without a watch: list again every resync
      relist_ = true;
      sync = true;
    }
    if (absl::Now() >= no_execute_due_) {
      no_execute_due_ = absl::InfiniteFuture();  // a held NoExecute taint's debounce is over
      dirty_ = true;
      sync = true;
    }
    if (watch_.stream != nullptr) next = watch_.deadline;
    next = std::min({next, next_list_, reopen_at_, no_execute_due_});
  }
  if (sync) PostSync();
  return next;
}

void SlicePublisher::ReadWatch() {
  std::vector<std::string> lines;
  absl::StatusOr<std::optional<HttpResponse>> read =
      watch_.stream->ReadAvailable([&](absl::string_view line) {
        lines.emplace_back(line);
        return absl::OkStatus();
      });
  const bool ended = !read.ok() || read->has_value();
  watch_.lines += lines.size();
  const bool proved = watch_.lines > 0 || absl::Now() - watch_.asked >= absl::Seconds(1);
  // Ended within a second of asking, with nothing in it: the next one after a backoff, which only
  // a watch that proved itself resets.
  const bool at_once = ended && read.ok() && (*read)->status == 200 && !proved;
  if (proved) short_watches_.Reset();
  if (at_once) {
    if (!short_watch_said_) {
      LOG(WARNING) << options_.driver << ": the API server ended the ResourceSlice watch at once "
                   << "(within a second, with nothing in it; a proxy that cuts long requests?): "
                   << "asking again after a backoff";
      short_watch_said_ = true;
    }
    reopen_at_ = absl::Now() + short_watches_.Next();
  }
  bool sync = ended && !at_once;
  {
    absl::MutexLock lock(&mu_);
    if (watch_.id == stream_id_) {  // not dropped meanwhile
      for (std::string& line : lines) {
        if (events_.empty()) {
          // Nothing waits for the worker: a bookmark only moves where the next watch starts.
          const json event = json::parse(line, nullptr, false);
          const WatchEventHead head = HeadOf(event);
          if (head.type == "BOOKMARK" && !head.version.empty()) {
            bookmark_version_ = head.version;
            status_.resource_version = head.version;
            continue;
          }
        }
        events_.push_back(std::move(line));
        sync = true;
      }
      if (ended) {
        stream_open_ = false;
        stream_end_ = read.ok() ? absl::StatusOr<HttpResponse>(**read) : read.status();
      }
    }
  }
  if (ended) watch_ = {};
  if (sync) PostSync();
}

void SlicePublisher::DropWatch() {
  {
    absl::MutexLock lock(&mu_);
    ++stream_id_;
    stream_open_ = false;
    opened_ = {};
    events_.clear();
    bookmark_version_.clear();
    stream_end_.reset();
  }
  Wake();
}

SerialWorker::Outcome SlicePublisher::Sync() {
  std::vector<std::string> events;
  std::optional<absl::StatusOr<HttpResponse>> end;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return SerialWorker::Outcome::kDone;
    ++status_.syncs;
    // A bookmark came before every event waiting here.
    if (!bookmark_version_.empty()) view_.resource_version = std::move(bookmark_version_);
    bookmark_version_.clear();
    events.swap(events_);
    end.swap(stream_end_);
    reconcile_ = reconcile_ || dirty_;
    dirty_ = false;
    if (relist_) view_.synced = false;
    relist_ = false;
  }
  absl::Status watch_error;
  for (const std::string& line : events) {
    absl::StatusOr<bool> changed = ApplyEvent(line);
    if (!changed.ok()) {
      // 410 Gone: the watch's version is compacted away; list again. Anything else: a failed watch.
      if (absl::IsOutOfRange(changed.status())) {
        view_.synced = false;
      } else {
        watch_error = changed.status();
      }
      DropWatch();
      end.reset();
      break;
    }
    reconcile_ = reconcile_ || *changed;  // someone else changed our slices: compare now
  }
  if (end.has_value()) watch_error = WatchEnded(*end);

  const bool refused = status().watch_refused;
  if (reconcile_ || !view_.synced) {
    const uint64_t lists = status().lists;
    absl::Status result = Reconcile(view_);
    if (absl::IsCancelled(result)) return SerialWorker::Outcome::kDone;  // stopping
    // A list is a new view: the watch starts again from it, not from before it.
    if (status().lists != lists) DropWatch();
    if (!result.ok()) {
      reconcile_ = true;
      return Failed(result, "cannot publish the ResourceSlice");
    }
    reconcile_ = false;
    if (refused) {
      {
        absl::MutexLock lock(&mu_);
        next_list_ = absl::Now() + options_.resync;
      }
      Wake();  // the loop's wake time
    }
  }
  if (!watch_error.ok()) return Failed(watch_error, "the ResourceSlice watch failed");
  if (absl::Now() >= next_chore_) {
    options_.chore();
    next_chore_ = absl::Now() + options_.chore_interval;
  }
  bool open = false;
  {
    absl::MutexLock lock(&mu_);
    open = stream_open_;
  }
  if (!refused && !open) {
    if (absl::Status opened = OpenWatch(); !opened.ok()) {
      return Failed(opened, "the ResourceSlice watch failed");
    }
  }
  return SerialWorker::Outcome::kDone;
}

SerialWorker::Outcome SlicePublisher::Failed(const absl::Status& error, absl::string_view what) {
  // Cancelled: the daemon stops; nothing more to ask the API server, nothing to say.
  if (absl::IsCancelled(error)) return SerialWorker::Outcome::kDone;
  errors_.Warn(absl::StrCat(options_.driver, ": ", what, ": ", error.message(), " (retrying)"));
  return SerialWorker::Outcome::kRetry;
}

absl::Status SlicePublisher::WatchEnded(const absl::StatusOr<HttpResponse>& end) {
  if (!end.ok()) return end.status();
  switch (end->status) {
    case 200: {
      // The server ended it (timeoutSeconds): renewed in this sync. An API server that dropped
      // taints may keep them now (its gate turned on): try again.
      absl::MutexLock lock(&mu_);
      if (taints_dropped_) {
        taints_dropped_ = false;
        reconcile_ = true;
      }
      return absl::OkStatus();
    }
    case 410:
      view_.synced = false;
      return absl::OkStatus();
    case 403:
    case 405: {
      LOG(WARNING) << options_.driver << ": the API server refuses to watch ResourceSlices (the "
                   << "daemon's role lacks the watch verb?): listing them every "
                   << absl::FormatDuration(options_.resync) << " instead";
      {
        absl::MutexLock lock(&mu_);
        status_.watch_refused = true;
        next_list_ = absl::Now() + options_.resync;
      }
      Wake();
      return absl::OkStatus();
    }
    default:
      return HttpError("watching ResourceSlices", *end);
  }
}

absl::Status SlicePublisher::OpenWatch() {
  // As client-go's reflector: the server ends the watch after a random time between resync and
  // twice that (the fleet's renewals spread out), and we wait a little longer than that.
  static thread_local std::mt19937 random(std::random_device{}());
  const int64_t base = std::max<int64_t>(1, absl::ToInt64Seconds(options_.resync));
  const int64_t timeout_seconds = std::uniform_int_distribution<int64_t>(base, 2 * base)(random);
  const std::string path =
      absl::StrCat(kSlicesPath, "?watch=true&allowWatchBookmarks=true&fieldSelector=",
                   SliceFieldSelector(options_.driver, options_.node_name),
                   "&resourceVersion=", UrlEncode(view_.resource_version),
                   "&timeoutSeconds=", timeout_seconds);
  {
    absl::MutexLock lock(&mu_);
    ++status_.watches;
  }
  const absl::Time asked = absl::Now();  // before the server can start the watch's time
  absl::StatusOr<std::unique_ptr<WatchStream>> opened = client_->OpenWatch(path);
  if (!opened.ok()) return opened.status();
  {
    absl::MutexLock lock(&mu_);
    ++stream_id_;
    stream_open_ = true;
    opened_ = {*std::move(opened), stream_id_,
               absl::Now() + absl::Seconds(timeout_seconds) + absl::Seconds(30), asked};
  }
  Wake();
  return absl::OkStatus();
}

absl::StatusOr<bool> SlicePublisher::ApplyEvent(absl::string_view line) {
  const json event = json::parse(line, nullptr, false);
  const auto [type, object, metadata, version] = HeadOf(event);
  if (type == "ERROR") {
    // A metav1.Status: 410 Gone (Expired) says the resourceVersion is compacted away.
    const int64_t code = object == nullptr ? 0 : JsonInt(*object, "code").value_or(0);
    if (code == 410) return absl::OutOfRangeError("the watch's resourceVersion is gone");
    return absl::UnavailableError(absl::StrCat(
        "the watch ended with an error: ",
        object == nullptr ? std::string("(none given)")
                          : JsonString(*object, "message").value_or(object->dump())));
  }
  if (metadata == nullptr) {
    return absl::DataLossError(absl::StrCat("not a watch event: ", line.substr(0, 200)));
  }
  if (!version.empty()) {
    view_.resource_version = version;
    absl::MutexLock lock(&mu_);
    status_.resource_version = version;
  }
  if (type == "BOOKMARK") return false;
  const std::string name = JsonString(*metadata, "name").value_or("");
  if (type == "DELETED") return view_.slices.erase(name) != 0;
  if (type == "ADDED" || type == "MODIFIED") {
    auto known = view_.slices.find(name);
    // Our own write's event, or an older one replayed (the watch starts from the list's
    // version, before our writes): the view holds that or newer already.
    if (known != view_.slices.end() &&
        !NewerVersion(version, JsonString(known->second["metadata"], "resourceVersion").value_or(""))) {
      return false;
    }
    view_.slices[name] = *object;
    return true;
  }
  return absl::DataLossError(absl::StrCat("a watch event of unknown type \"", type, "\""));
}

absl::Status SlicePublisher::ReconcileOnce() {
  View view;
  return Reconcile(view);
}

std::string SlicePublisher::NodeUid() {
  if (!node_uid_.empty()) return node_uid_;
  absl::StatusOr<HttpResponse> response =
      client_->Request("GET", absl::StrCat("/api/v1/nodes/", options_.node_name));
  if (response.ok() && response->status == 200) {
    json node = json::parse(response->body, nullptr, false);
    if (const json* metadata = JsonMember(node, "metadata"); metadata != nullptr) {
      node_uid_ = JsonString(*metadata, "uid").value_or("");
    }
  }
  if (node_uid_.empty() && !client_->cancelled()) {
    errors_.Warn(absl::StrCat(options_.driver, ": cannot read Node ", options_.node_name,
                              "'s UID: the ResourceSlice is published without an owner reference "
                              "(it will not be removed with the Node)"));
  }
  return node_uid_;
}

absl::Status SlicePublisher::List(View& view) {
  absl::StatusOr<HttpResponse> response = client_->Request(
      "GET", absl::StrCat(kSlicesPath, "?fieldSelector=", SliceFieldSelector(options_.driver, options_.node_name)));
  {
    absl::MutexLock lock(&mu_);
    ++status_.lists;
  }
  if (!response.ok()) return response.status();
  if (response->status != 200) return HttpError("listing ResourceSlices", *response);
  json list = json::parse(response->body, nullptr, false);
  const json* items = JsonMember(list, "items");
  const json* metadata = JsonMember(list, "metadata");
  if (items == nullptr || !items->is_array() || metadata == nullptr) {
    return absl::UnavailableError("listing ResourceSlices: the answer is not a ResourceSliceList");
  }
  view.slices.clear();
  for (const json& item : *items) {
    // Only a slice we can name can be updated or deleted (a DELETE with an empty name would be
    // one on the collection's path).
    const json* item_metadata = JsonMember(item, "metadata");
    const std::string name =
        item_metadata == nullptr ? "" : JsonString(*item_metadata, "name").value_or("");
    if (!name.empty()) view.slices[name] = item;
  }
  view.resource_version = JsonString(*metadata, "resourceVersion").value_or("");
  view.synced = true;
  absl::MutexLock lock(&mu_);
  status_.resource_version = view.resource_version;
  return absl::OkStatus();
}

void SlicePublisher::HoldNoExecute(json* devices, absl::Time now) {
  std::map<std::string, absl::Time> since;  // of the NoExecute taints wanted now
  absl::Time due = absl::InfiniteFuture();
  for (json& device : *devices) {
    if (!HasTaints(device)) continue;
    for (json& taint : device["taints"]) {
      if (taint.value("effect", "") != "NoExecute") continue;
      const std::string key = absl::StrCat(device.value("name", ""), "\n", taint.value("key", ""),
                                           "\n", taint.value("value", ""));
      auto known = no_execute_since_.find(key);
      const absl::Time first = known == no_execute_since_.end() ? now : known->second;
      since[key] = first;
      if (now - first < options_.no_execute_after) {
        taint["effect"] = "NoSchedule";  // not yet: pods keep running, no new one gets it
        due = std::min(due, first + options_.no_execute_after);
      }
    }
  }
  no_execute_since_ = std::move(since);  // a condition that went away starts again from zero
  absl::MutexLock lock(&mu_);
  if (due < no_execute_due_ || no_execute_due_ <= now) {
    no_execute_due_ = due;
    if (due != absl::InfiniteFuture()) Wake();  // the loop's next wake-up includes it
  }
}

absl::Status SlicePublisher::Reconcile(View& view) {
  std::vector<std::string> notes;
  for (int attempt = 0; attempt < kConflictRetries; ++attempt) {
    std::shared_ptr<const Snapshot> snapshot = set_->Current();
    notes.clear();
    const UnhealthyDevices unhealthy = [this] {
      absl::MutexLock lock(&mu_);
      return taints_dropped_ ? UnhealthyDevices::kLeftOut : UnhealthyDevices::kTainted;
    }();
    json devices = SliceDevices(*snapshot, &notes, unhealthy, options_.sharing);
    HoldNoExecute(&devices, absl::Now());
    for (const std::string& note : notes) errors_.Warn(absl::StrCat(options_.driver, ": ", note));
    if (!view.synced) {
      if (absl::Status listed = List(view); !listed.ok()) {
        absl::MutexLock lock(&mu_);
        status_.published = false;
        status_.last_error = std::string(listed.message());
        return listed;
      }
    }
    // Ours: the first slice of our pool; any other slice of this driver on this node goes. The
    // view holds only slices with a name.
    const json* ours = nullptr;
    std::vector<const json*> extra;
    int64_t highest_generation = 0;
    for (const auto& [slice_name, item] : view.slices) {
      const json* spec = JsonMember(item, "spec");
      const json* pool = spec == nullptr ? nullptr : JsonMember(*spec, "pool");
      if (pool != nullptr) {
        highest_generation = std::max(highest_generation, JsonInt(*pool, "generation").value_or(0));
      }
      const bool our_pool = pool != nullptr && JsonString(*pool, "name") == options_.node_name;
      if (our_pool && ours == nullptr) {
        ours = &item;
      } else {
        extra.push_back(&item);
      }
    }
    uint64_t writes = 0;
    bool conflict = false;
    bool taints_dropped = false;  // this write showed that the API server does not keep taints
    absl::Status error;
    std::vector<std::string> gone;  // deleted: out of the view
    json written;                   // the slice the API server answered a write with
    for (const json* item : extra) {
      const json& metadata = *JsonMember(*item, "metadata");
      const std::string stray_name = JsonString(metadata, "name").value_or("");
      json options{{"kind", "DeleteOptions"},
                   {"apiVersion", "v1"},
                   {"preconditions",
                    {{"uid", JsonString(metadata, "uid").value_or("")},
                     {"resourceVersion", JsonString(metadata, "resourceVersion").value_or("")}}}};
      absl::StatusOr<HttpResponse> response = client_->Request(
          "DELETE", absl::StrCat(kSlicesPath, "/", stray_name), "application/json", options.dump());
      ++writes;
      if (!response.ok()) {
        error = response.status();
      } else if (response->status == 409) {
        conflict = true;
      } else if (response->status != 200 && response->status != 202 && response->status != 404) {
        error = HttpError(absl::StrCat("deleting ResourceSlice ", stray_name), *response);
      } else {
        gone.push_back(stray_name);
      }
    }
    std::string name;
    int64_t generation = 0;
    if (error.ok() && !conflict) {
      if (ours == nullptr) {
        generation = std::max<int64_t>(highest_generation, status().generation) + 1;
        json slice = ResourceSliceObject(options_.driver, options_.node_name, NodeUid(), generation, devices);
        absl::StatusOr<HttpResponse> response =
            client_->Request("POST", kSlicesPath, "application/json", slice.dump());
        ++writes;
        if (!response.ok()) {
          error = response.status();
        } else if (response->status == 409) {
          conflict = true;
        } else if (TaintsRefused(devices, *response)) {
          taints_dropped = true;
        } else if (response->status != 201 && response->status != 200) {
          error = HttpError("creating the ResourceSlice", *response);
        } else {
          taints_dropped = TaintsDropped(devices, response->body);
          written = json::parse(response->body, nullptr, false);
          if (const json* metadata = JsonMember(written, "metadata"); metadata != nullptr) {
            name = JsonString(*metadata, "name").value_or("");
          }
          LOG(INFO) << options_.driver << ": created ResourceSlice " << name << " (pool "
                    << options_.node_name << ", generation " << generation << ", "
                    << devices.size() << " device(s))";
        }
      } else {
        // `ours` has a named metadata and an object spec.pool (the loop above checked): the
        // writes below through operator[] cannot meet a non-object.
        json slice = *ours;
        name = JsonString(slice["metadata"], "name").value_or("");
        generation = JsonInt(slice["spec"]["pool"], "generation").value_or(0);
        const json* listed_devices = JsonMember(slice["spec"], "devices");
        KeepTimeAdded(listed_devices, &devices);
        const bool same = listed_devices != nullptr && *listed_devices == devices &&
                          JsonInt(slice["spec"]["pool"], "resourceSliceCount") == 1;
        if (!same) {
          generation = std::max(generation, status().generation) + 1;
          slice["spec"]["devices"] = devices;
          slice["spec"]["pool"]["generation"] = generation;
          slice["spec"]["pool"]["resourceSliceCount"] = 1;
          absl::StatusOr<HttpResponse> response = client_->Request(
              "PUT", absl::StrCat(kSlicesPath, "/", name), "application/json", slice.dump());
          ++writes;
          if (!response.ok()) {
            error = response.status();
          } else if (response->status == 409 || response->status == 404) {
            conflict = true;  // changed or deleted since the view saw it: list again
          } else if (TaintsRefused(devices, *response)) {
            taints_dropped = true;
          } else if (response->status != 200) {
            error = HttpError(absl::StrCat("updating ResourceSlice ", name), *response);
          } else {
            taints_dropped = TaintsDropped(devices, response->body);
            written = json::parse(response->body, nullptr, false);
            LOG(INFO) << options_.driver << ": updated ResourceSlice " << name << " (generation "
                      << generation << ", " << devices.size() << " device(s))";
          }
        }
      }
    }
    for (const std::string& deleted : gone) view.slices.erase(deleted);
    // The view takes what a write answered (its resourceVersion is how the watch's event of this
    // write is known as ours); a 409 means the view is stale: list again.
    const json* written_metadata = JsonMember(written, "metadata");
    if (!name.empty() && written_metadata != nullptr &&
        JsonString(*written_metadata, "name") == name) {
      view.slices[name] = written;
    }
    if (conflict) view.synced = false;
    absl::MutexLock lock(&mu_);
    status_.writes += writes;
    if (taints_dropped) {
      // The slice as written offers the Unhealthy devices untainted (or was refused): write it
      // again at once without them.
      taints_dropped_ = true;
      if (!status_.taints_dropped) {
        LOG(WARNING) << options_.driver << ": the API server does not keep device taints (is the "
                     << "DRADeviceTaints feature gate off? it is on by default from Kubernetes "
                     << "1.36): Unhealthy devices are left out of the ResourceSlice instead of "
                     << "being published tainted (tried again as each watch is renewed)";
      }
      status_.taints_dropped = true;
      continue;
    }
    if (conflict) {
      ++status_.conflicts;  // someone else wrote it since we read it: read again
      continue;
    }
    // A write with taints that the API server kept: taints are back (the gate was turned on).
    if (error.ok() && !taints_dropped_ && !written.is_null() &&
        std::any_of(devices.begin(), devices.end(), [](const json& d) { return HasTaints(d); })) {
      status_.taints_dropped = false;
    }
    status_.last_error = std::string(error.message());
    status_.published = error.ok();
    if (error.ok()) {
      status_.generation = generation;
      status_.devices = devices.size();
      status_.tainted = static_cast<size_t>(
          std::count_if(devices.begin(), devices.end(), [](const json& d) { return HasTaints(d); }));
      status_.slice_name = name;
    }
    return error;
  }
  absl::MutexLock lock(&mu_);
  status_.published = false;
  status_.last_error = "the ResourceSlice kept changing under us (409 Conflict five times)";
  return absl::AbortedError(status_.last_error);
}

}  // namespace edgeaccel
