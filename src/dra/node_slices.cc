#include "edgeaccel/dra/node_slices.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <random>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "edgeaccel/host/json_fields.h"
#include "glog/logging.h"

namespace edgeaccel {
namespace {

using nlohmann::json;

constexpr char kSlicesPath[] = "/apis/resource.k8s.io/v1/resourceslices";

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

std::string NameOf(const json& slice) {
  const json* metadata = JsonMember(slice, "metadata");
  return metadata == nullptr ? "" : JsonString(*metadata, "name").value_or("");
}

std::string VersionOf(const json& slice) {
  const json* metadata = JsonMember(slice, "metadata");
  return metadata == nullptr ? "" : JsonString(*metadata, "resourceVersion").value_or("");
}

std::string DriverOf(const json& slice) {
  const json* spec = JsonMember(slice, "spec");
  return spec == nullptr ? "" : JsonString(*spec, "driver").value_or("");
}

}  // namespace

absl::Status SliceAnswerError(absl::string_view what, const HttpResponse& response) {
  // The message of a metav1.Status answer, or the start of the body.
  const json body = json::parse(response.body, nullptr, false);
  return absl::UnavailableError(absl::StrCat(what, ": the API server answered ", response.status, ": ",
                                             JsonString(body, "message").value_or(response.body.substr(0, 200))));
}

std::string SliceFieldSelector(absl::string_view driver, absl::string_view node_name) {
  return UrlEncode(driver.empty() ? absl::StrCat("spec.nodeName=", node_name)
                                  : absl::StrCat("spec.driver=", driver, ",spec.nodeName=", node_name));
}

bool NewerVersion(const std::string& version, const std::string& known) {
  uint64_t a = 0, b = 0;
  if (!absl::SimpleAtoi(version, &a) || !absl::SimpleAtoi(known, &b)) return version != known;
  return a > b;
}

NodeSlices::NodeSlices(Options options, const ApiClient* client)
    : options_(std::move(options)),
      client_(client),
      wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      short_watches_(options_.initial_backoff, options_.max_backoff, 0.2) {}

NodeSlices::~NodeSlices() {
  Stop();
  if (wake_fd_ >= 0) close(wake_fd_);
}

void NodeSlices::Wake() {
  const uint64_t one = 1;
  if (wake_fd_ >= 0 && write(wake_fd_, &one, sizeof(one)) < 0) {
    // Only a counter at its maximum fails, and then it is signalled already.
  }
}

void NodeSlices::PostSync() {
  worker_.PostRetrying("sync", [this] { return Sync(); },
                       {.first = options_.initial_backoff,
                        .max = options_.max_backoff,
                        .jitter = 0.2,
                        .newer_waits_for_retry = true});
}

uint64_t NodeSlices::Subscribe(const std::string& driver, std::function<void(Change)> on_change) {
  uint64_t id = 0;
  {
    absl::MutexLock lock(&subscribers_mu_);
    id = ++next_subscriber_;
    subscribers_[id] = {driver, std::move(on_change)};
  }
  bool join = false;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return id;
    subscribed_ = true;
    join = loop_ == nullptr;
    if (join) {
      if (options_.loop == nullptr) own_loop_ = std::make_unique<PollLoop>("ea-dra-loop");
      loop_ = options_.loop != nullptr ? options_.loop : own_loop_.get();
    }
  }
  if (join) loop_->Add(this);
  PostSync();
  return id;
}

void NodeSlices::Unsubscribe(uint64_t id) {
  bool none = false;
  {
    absl::MutexLock lock(&subscribers_mu_);
    subscribers_.erase(id);
    none = subscribers_.empty();
  }
  if (!none) return;
  {
    absl::MutexLock lock(&mu_);
    subscribed_ = false;
    DropWatch();  // nobody reads the view: no watch
  }
  Wake();
}

void NodeSlices::Stop() {
  PollLoop* loop = nullptr;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    loop = std::exchange(loop_, nullptr);
  }
  if (loop != nullptr) loop->Remove(this);
  worker_.Stop();  // waits for a sync under way: its request ends at the client's Cancel
  own_loop_.reset();
  watch_ = {};
  absl::MutexLock lock(&mu_);
  opened_ = {};
}

NodeSlices::Status NodeSlices::status() const {
  absl::MutexLock lock(&mu_);
  Status status = status_;
  status.synced = synced_;
  return status;
}

absl::StatusOr<NodeSlices::View> NodeSlices::Slices(const std::string& driver) {
  auto view_of = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    View view;
    view.resource_version = resource_version_;
    for (const auto& [name, slice] : slices_) {
      if (DriverOf(slice) == driver) view.slices[name] = slice;
    }
    return view;
  };
  {
    absl::MutexLock lock(&mu_);
    if (synced_) return view_of();
  }
  if (absl::StatusOr<bool> listed = ListUnlessSynced(); !listed.ok()) return listed.status();
  PostSync();  // the watch starts again from the list
  absl::MutexLock lock(&mu_);
  return view_of();
}

void NodeSlices::MarkStale() {
  absl::MutexLock lock(&mu_);
  synced_ = false;
}

void NodeSlices::Wrote(const json& slice) {
  const std::string name = NameOf(slice);
  if (name.empty()) return;
  absl::MutexLock lock(&mu_);
  auto known = slices_.find(name);
  if (known == slices_.end() || NewerVersion(VersionOf(slice), VersionOf(known->second))) {
    slices_[name] = slice;
  }
}

void NodeSlices::Deleted(const std::string& name) {
  absl::MutexLock lock(&mu_);
  slices_.erase(name);
}

void NodeSlices::Notify(const std::set<std::string>& drivers, bool all, Change change) {
  if (!all && drivers.empty()) return;
  absl::MutexLock lock(&subscribers_mu_);
  for (const auto& [id, subscriber] : subscribers_) {
    if (all || drivers.count(subscriber.first) > 0) subscriber.second(change);
  }
}

PollLoop::Fds NodeSlices::WaitFds() {
  return {wake_fd_, watch_.stream != nullptr ? watch_.stream->fd() : -1, -1, -1};
}

absl::Time NodeSlices::Step(const PollLoop::Events& ready) {
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
      watch_ = {};  // the worker dropped it (a new list, or no subscriber left)
    }
    const absl::Time now = absl::Now();
    if (watch_.stream != nullptr && now >= watch_.deadline) {
      // The server did not end it when asked: as if it had, another one from where we are.
      watch_ = {};
      stream_open_ = false;
      HttpResponse renewed;
      renewed.status = 200;
      stream_end_ = renewed;
      sync = true;
    }
    if (now >= reopen_at_) {
      reopen_at_ = absl::InfiniteFuture();  // after a watch ended at once: the next one now
      sync = true;
    }
    if (now >= next_list_) {
      next_list_ = absl::InfiniteFuture();  // without a watch: list again every resync
      synced_ = false;
      sync = true;
    }
    if (watch_.stream != nullptr) next = watch_.deadline;
    next = std::min({next, next_list_, reopen_at_});
  }
  if (sync) PostSync();
  return next;
}

void NodeSlices::ReadWatch() {
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
      LOG(WARNING) << "the API server ended the ResourceSlice watch at once (within a second, with "
                   << "nothing in it; a proxy that cuts long requests?): asking again after a backoff";
      short_watch_said_ = true;
    }
  }
  bool sync = ended && !at_once;
  std::set<std::string> changed;
  {
    absl::MutexLock lock(&mu_);
    if (at_once) reopen_at_ = absl::Now() + short_watches_.Next();
    if (watch_.id == stream_id_) {  // not dropped meanwhile
      for (const std::string& line : lines) {
        absl::StatusOr<std::optional<std::string>> driver = ApplyEvent(line);
        if (!driver.ok()) {
          // 410 Gone: the watch's version is compacted away; list again. Anything else: a failed
          // watch, opened again after the backoff.
          if (absl::IsOutOfRange(driver.status())) {
            synced_ = false;
          } else {
            watch_error_ = driver.status();
          }
          DropWatch();
          sync = true;
          break;
        }
        if (driver->has_value()) changed.insert(**driver);
      }
      if (ended && watch_.id == stream_id_) {
        stream_open_ = false;
        stream_end_ = read.ok() ? absl::StatusOr<HttpResponse>(**read) : read.status();
      }
    }
  }
  if (ended) watch_ = {};
  Notify(changed, false, Change::kSlices);
  if (sync) PostSync();
}

absl::StatusOr<std::optional<std::string>> NodeSlices::ApplyEvent(absl::string_view line) {
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
  // An event the last list holds already (a list made while this watch was open).
  const bool listed = !version.empty() && !NewerVersion(version, listed_version_);
  if (!version.empty() && !listed && NewerVersion(version, resource_version_)) {
    resource_version_ = version;
    status_.resource_version = version;
  }
  if (type == "BOOKMARK" || listed) return std::optional<std::string>();
  const std::string name = JsonString(*metadata, "name").value_or("");
  const std::string driver = DriverOf(*object);
  if (type == "DELETED") {
    auto known = slices_.find(name);
    if (known == slices_.end()) return std::optional<std::string>();
    const std::string known_driver = DriverOf(known->second);
    slices_.erase(known);
    return std::optional<std::string>(known_driver);
  }
  if (type == "ADDED" || type == "MODIFIED") {
    auto known = slices_.find(name);
    // Our own write's event (Wrote put it in with this version), or an older one replayed: the
    // view holds that or newer already.
    if (known != slices_.end() && !NewerVersion(version, VersionOf(known->second))) {
      return std::optional<std::string>();
    }
    slices_[name] = *object;
    return std::optional<std::string>(driver);
  }
  return absl::DataLossError(absl::StrCat("a watch event of unknown type \"", type, "\""));
}

void NodeSlices::DropWatch() {
  ++stream_id_;
  stream_open_ = false;
  opened_ = {};
  stream_end_.reset();
  Wake();
}

Workers::Outcome NodeSlices::Sync() {
  std::optional<absl::StatusOr<HttpResponse>> end;
  absl::Status watch_error;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return Workers::Outcome::kDone;
    if (!subscribed_) {
      DropWatch();
      return Workers::Outcome::kDone;
    }
    end.swap(stream_end_);
    watch_error = std::exchange(watch_error_, absl::OkStatus());
  }
  bool renewed = false;
  if (end.has_value()) {
    absl::Status ended = WatchEnded(*end, &renewed);  // a 410 unsyncs the view
    if (watch_error.ok()) watch_error = ended;
  }
  absl::StatusOr<bool> listed = ListUnlessSynced();
  if (!listed.ok()) return Failed(listed.status(), "cannot list the node's ResourceSlices");
  if (*listed) {
    {
      absl::MutexLock lock(&mu_);
      if (status_.watch_refused) next_list_ = absl::Now() + options_.resync;
    }
    Wake();  // the loop's wake time (listing every resync)
    // A fresh list may show what someone else changed.
    Notify({}, true, Change::kSlices);
  }
  // A renewal lets a publisher try again what the API server dropped (taints).
  if (renewed) Notify({}, true, Change::kRenewed);
  if (!watch_error.ok()) return Failed(watch_error, "the ResourceSlice watch failed");
  bool open = false;
  bool refused = false;
  {
    absl::MutexLock lock(&mu_);
    // After a watch ended at once the loop asks for the next one when its backoff is over.
    open = stream_open_ || reopen_at_ != absl::InfiniteFuture();
    refused = status_.watch_refused;
  }
  if (!refused && !open) {
    if (absl::Status opened = OpenWatch(); !opened.ok()) {
      return Failed(opened, "the ResourceSlice watch failed");
    }
  }
  absl::MutexLock lock(&mu_);
  status_.last_error.clear();
  return Workers::Outcome::kDone;
}

Workers::Outcome NodeSlices::Failed(const absl::Status& error, absl::string_view what) {
  // Cancelled: the daemon stops; nothing more to ask the API server, nothing to say.
  if (absl::IsCancelled(error)) return Workers::Outcome::kDone;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return Workers::Outcome::kDone;
    status_.last_error = std::string(error.message());
  }
  errors_.Warn(absl::StrCat(what, ": ", error.message(), " (retrying)"));
  return Workers::Outcome::kRetry;
}

absl::Status NodeSlices::WatchEnded(const absl::StatusOr<HttpResponse>& end, bool* renewed) {
  if (!end.ok()) return end.status();
  switch (end->status) {
    case 200:
      *renewed = true;  // the server ended it (timeoutSeconds): renewed in this sync
      return absl::OkStatus();
    case 410: {
      absl::MutexLock lock(&mu_);
      synced_ = false;
      return absl::OkStatus();
    }
    case 403:
    case 405: {
      LOG(WARNING) << "the API server refuses to watch ResourceSlices (the daemon's role lacks the "
                   << "watch verb?): listing them every " << absl::FormatDuration(options_.resync)
                   << " instead";
      {
        absl::MutexLock lock(&mu_);
        status_.watch_refused = true;
        next_list_ = absl::Now() + options_.resync;
      }
      Wake();
      return absl::OkStatus();
    }
    default:
      return SliceAnswerError("watching ResourceSlices", *end);
  }
}

absl::Status NodeSlices::OpenWatch() {
  // As client-go's reflector: the server ends the watch after a random time between resync and
  // twice that (the fleet's renewals spread out), and we wait a little longer than that.
  static thread_local std::mt19937 random(std::random_device{}());
  const int64_t base = std::max<int64_t>(1, absl::ToInt64Seconds(options_.resync));
  const int64_t timeout_seconds = std::uniform_int_distribution<int64_t>(base, 2 * base)(random);
  std::string version;
  {
    absl::MutexLock lock(&mu_);
    version = resource_version_;
    ++status_.watches;
  }
  const std::string path =
      absl::StrCat(kSlicesPath, "?watch=true&allowWatchBookmarks=true&fieldSelector=",
                   SliceFieldSelector("", options_.node_name), "&resourceVersion=", UrlEncode(version),
                   "&timeoutSeconds=", timeout_seconds);
  const absl::Time asked = absl::Now();  // before the server can start the watch's time
  absl::StatusOr<std::unique_ptr<WatchStream>> opened = client_->OpenWatch(path);
  if (!opened.ok()) return opened.status();
  {
    absl::MutexLock lock(&mu_);
    // Listed meanwhile (a publisher's MarkStale and Slices): this one starts before that list;
    // the sync the list posted opens one from it.
    if (resource_version_ != version || !synced_ || stopping_ || !subscribed_) return absl::OkStatus();
    ++stream_id_;
    stream_open_ = true;
    opened_ = {*std::move(opened), stream_id_,
               absl::Now() + absl::Seconds(timeout_seconds) + absl::Seconds(30), asked};
  }
  Wake();
  return absl::OkStatus();
}

absl::StatusOr<bool> NodeSlices::ListUnlessSynced() {
  {
    absl::MutexLock lock(&mu_);
    if (synced_) return false;  // the common case: no wait behind another caller's LIST
  }
  absl::MutexLock listing(&list_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (synced_) return false;
  }
  if (absl::Status listed = List(); !listed.ok()) return listed;
  return true;
}

absl::Status NodeSlices::List() {
  absl::StatusOr<HttpResponse> response = client_->Request(
      "GET", absl::StrCat(kSlicesPath, "?fieldSelector=", SliceFieldSelector("", options_.node_name)));
  {
    absl::MutexLock lock(&mu_);
    ++status_.lists;
  }
  absl::Status error;
  json list;
  if (!response.ok()) {
    error = response.status();
  } else if (response->status != 200) {
    error = SliceAnswerError("listing ResourceSlices", *response);
  } else {
    list = json::parse(response->body, nullptr, false);
  }
  const json* items = error.ok() ? JsonMember(list, "items") : nullptr;
  const json* metadata = error.ok() ? JsonMember(list, "metadata") : nullptr;
  if (error.ok() && (items == nullptr || !items->is_array() || metadata == nullptr)) {
    error = absl::UnavailableError("listing ResourceSlices: the answer is not a ResourceSliceList");
  }
  absl::MutexLock lock(&mu_);
  if (!error.ok()) {
    status_.last_error = std::string(error.message());
    return error;
  }
  slices_.clear();
  for (const json& item : *items) {
    // Only a slice we can name can be updated or deleted (a DELETE with an empty name would be
    // one on the collection's path).
    const std::string name = NameOf(item);
    if (!name.empty()) slices_[name] = item;
  }
  resource_version_ = JsonString(*metadata, "resourceVersion").value_or("");
  listed_version_ = resource_version_;
  status_.resource_version = resource_version_;
  status_.last_error.clear();
  synced_ = true;
  DropWatch();  // a list is a new view: the watch starts again from it
  return absl::OkStatus();
}

}  // namespace edgeaccel
