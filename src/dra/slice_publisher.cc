#include "edgeaccel/dra/slice_publisher.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "edgeaccel/dra/resource_slice.h"
#include "edgeaccel/host/json_fields.h"
#include "glog/logging.h"

namespace edgeaccel {
namespace {

using nlohmann::json;

constexpr char kSlicesPath[] = "/apis/resource.k8s.io/v1/resourceslices";
constexpr int kConflictRetries = 5;

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

SlicePublisher::SlicePublisher(Options options, const ApiClient* client, DeviceSet* set)
    : options_(std::move(options)),
      client_(client),
      set_(set),
      wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  slices_ = options_.slices;
  if (slices_ == nullptr) {
    if (options_.loop == nullptr) own_loop_ = std::make_unique<PollLoop>("ea-dra-loop");
    own_slices_ = std::make_unique<NodeSlices>(
        NodeSlices::Options{.node_name = options_.node_name,
                            .resync = options_.resync,
                            .initial_backoff = options_.initial_backoff,
                            .max_backoff = options_.max_backoff,
                            .loop = options_.loop != nullptr ? options_.loop : own_loop_.get()},
        client_);
    slices_ = own_slices_.get();
  }
}

SlicePublisher::~SlicePublisher() {
  Stop();
  own_slices_.reset();  // before the loop it is a member of
  own_loop_.reset();
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
  subscription_ = slices_->Subscribe(options_.driver,
                                     [this](NodeSlices::Change change) { OnSlicesChange(change); });
  next_chore_ = options_.chore ? absl::Now() : absl::InfiniteFuture();
  loop_ = options_.loop != nullptr ? options_.loop : own_loop_.get();
  loop_->Add(this);
  PostSync();
}

void SlicePublisher::Stop() {
  if (listener_ != 0) {
    set_->Unsubscribe(listener_);
    listener_ = 0;
  }
  if (subscription_ != 0) {
    slices_->Unsubscribe(subscription_);
    subscription_ = 0;
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
  if (own_slices_ != nullptr) own_slices_->Stop();
}

void SlicePublisher::Resync() {
  slices_->MarkStale();
  {
    absl::MutexLock lock(&mu_);
    dirty_ = true;
  }
  PostSync();
}

void SlicePublisher::OnSlicesChange(NodeSlices::Change change) {
  {
    absl::MutexLock lock(&mu_);
    if (change == NodeSlices::Change::kSlices) {
      dirty_ = true;
    } else if (taints_dropped_) {
      // An API server that dropped taints may keep them now (its gate turned on): try again.
      taints_dropped_ = false;
      dirty_ = true;
    }
  }
  PostSync();  // a renewal alone runs the chore when it is due
}

SlicePublisher::Status SlicePublisher::status() const {
  const NodeSlices::Status view = slices_->status();
  absl::MutexLock lock(&mu_);
  Status status = status_;
  status.lists = view.lists;
  status.watches = view.watches;
  status.watch_refused = view.watch_refused;
  status.resource_version = view.resource_version;
  return status;
}

PollLoop::Fds SlicePublisher::WaitFds() { return {wake_fd_, -1, -1, -1}; }

absl::Time SlicePublisher::Step(const PollLoop::Events& ready) {
  if (ready[0] != 0) {
    uint64_t count;
    if (read(wake_fd_, &count, sizeof(count)) < 0) {
      // EAGAIN: nothing to take; the state below says what changed.
    }
  }
  bool sync = false;
  absl::Time next = absl::InfiniteFuture();
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::InfiniteFuture();
    if (absl::Now() >= no_execute_due_) {
      no_execute_due_ = absl::InfiniteFuture();  // a held NoExecute taint's debounce is over
      dirty_ = true;
      sync = true;
    }
    next = no_execute_due_;
  }
  if (sync) PostSync();
  return next;
}

Workers::Outcome SlicePublisher::Sync() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return Workers::Outcome::kDone;
    ++status_.syncs;
    reconcile_ = reconcile_ || dirty_;
    dirty_ = false;
  }
  if (reconcile_) {
    absl::Status result = Reconcile();
    if (absl::IsCancelled(result)) return Workers::Outcome::kDone;  // stopping
    if (!result.ok()) {
      reconcile_ = true;
      return Failed(result, "cannot publish the ResourceSlice");
    }
    reconcile_ = false;
  }
  if (absl::Now() >= next_chore_) {
    options_.chore();
    next_chore_ = absl::Now() + options_.chore_interval;
  }
  return Workers::Outcome::kDone;
}

Workers::Outcome SlicePublisher::Failed(const absl::Status& error, absl::string_view what) {
  // Cancelled: the daemon stops; nothing more to ask the API server, nothing to say.
  if (absl::IsCancelled(error)) return Workers::Outcome::kDone;
  errors_.Warn(absl::StrCat(options_.driver, ": ", what, ": ", error.message(), " (retrying)"));
  return Workers::Outcome::kRetry;
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

absl::Status SlicePublisher::Reconcile() {
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
    absl::StatusOr<NodeSlices::View> view = slices_->Slices(options_.driver);
    if (!view.ok()) {
      absl::MutexLock lock(&mu_);
      status_.published = false;
      status_.last_error = std::string(view.status().message());
      return view.status();
    }
    // Ours: the first slice of our pool; any other slice of this driver on this node goes. The
    // view holds only slices with a name.
    const json* ours = nullptr;
    std::vector<const json*> extra;
    int64_t highest_generation = 0;
    for (const auto& [slice_name, item] : view->slices) {
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
        error = SliceAnswerError(absl::StrCat("deleting ResourceSlice ", stray_name), *response);
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
          error = SliceAnswerError("creating the ResourceSlice", *response);
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
            error = SliceAnswerError(absl::StrCat("updating ResourceSlice ", name), *response);
          } else {
            taints_dropped = TaintsDropped(devices, response->body);
            written = json::parse(response->body, nullptr, false);
            LOG(INFO) << options_.driver << ": updated ResourceSlice " << name << " (generation "
                      << generation << ", " << devices.size() << " device(s))";
          }
        }
      }
    }
    for (const std::string& deleted : gone) slices_->Deleted(deleted);
    // The view takes what a write answered (its resourceVersion is how the watch's event of this
    // write is known as ours); a 409 means the view is stale: list again.
    const json* written_metadata = JsonMember(written, "metadata");
    if (!name.empty() && written_metadata != nullptr &&
        JsonString(*written_metadata, "name") == name) {
      slices_->Wrote(written);
    }
    if (conflict) slices_->MarkStale();
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
