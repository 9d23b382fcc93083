#include "edgeaccel/dra/slice_publisher.h"

#include <pthread.h>

#include <algorithm>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "edgeaccel/dra/resource_slice.h"
#include "edgeaccel/host/backoff.h"
#include "edgeaccel/node/json_fields.h"
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

std::string SliceFieldSelector(absl::string_view driver, absl::string_view node_name) {
  return UrlEncode(absl::StrCat("spec.driver=", driver, ",spec.nodeName=", node_name));
}

SlicePublisher::SlicePublisher(Options options, const ApiClient* client, DeviceSet* set)
    : options_(std::move(options)), client_(client), set_(set) {}

SlicePublisher::~SlicePublisher() { Stop(); }

void SlicePublisher::Start() {
  // A slice carries facts (compute capability, memory): a change of facts alone publishes too.
  listener_ = set_->Subscribe([this](std::shared_ptr<const Snapshot>) { Resync(); },
                              DeviceSet::Changes::kAdvertisedOrFacts);
  thread_ = std::thread([this] { Run(); });
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
  if (thread_.joinable()) thread_.join();
}

void SlicePublisher::Resync() {
  absl::MutexLock lock(&mu_);
  dirty_ = true;
}

SlicePublisher::Status SlicePublisher::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

void SlicePublisher::Run() {
  pthread_setname_np(pthread_self(), "ea-dra-slices");
  Backoff backoff(options_.initial_backoff, options_.max_backoff, 0.2);
  absl::Time next = absl::Now();
  // The chore runs after a reconcile once it is due (the first time after the first one), so it
  // never wakes the thread by itself.
  absl::Time next_chore = options_.chore ? absl::Now() : absl::InfiniteFuture();
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      auto due = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return dirty_ || stopping_; };
      mu_.AwaitWithDeadline(absl::Condition(&due), next);
      if (stopping_) return;
      dirty_ = false;
    }
    absl::Status result = Reconcile();
    if (result.ok()) {
      backoff.Reset();
      next = absl::Now() + options_.resync;
    } else if (absl::IsCancelled(result)) {
      next = absl::InfiniteFuture();  // stopping: nothing more to ask the API server
      next_chore = absl::InfiniteFuture();
      continue;
    } else {
      errors_.Warn(absl::StrCat(options_.driver, ": cannot publish the ResourceSlice: ", result.message(),
                                " (retrying)"));
      next = absl::Now() + backoff.Next();
    }
    if (absl::Now() >= next_chore) {
      options_.chore();
      next_chore = absl::Now() + options_.chore_interval;
    }
  }
}

absl::Status SlicePublisher::ReconcileOnce() { return Reconcile(); }

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

absl::StatusOr<json> SlicePublisher::ListSlices() const {
  absl::StatusOr<HttpResponse> response = client_->Request(
      "GET", absl::StrCat(kSlicesPath, "?fieldSelector=", SliceFieldSelector(options_.driver, options_.node_name)));
  if (!response.ok()) return response.status();
  if (response->status != 200) return HttpError("listing ResourceSlices", *response);
  json list = json::parse(response->body, nullptr, false);
  const json* items = JsonMember(list, "items");
  if (items == nullptr || !items->is_array()) {
    return absl::UnavailableError("listing ResourceSlices: the answer is not a ResourceSliceList");
  }
  return *items;
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
    json devices = SliceDevices(*snapshot, &notes, unhealthy);
    for (const std::string& note : notes) errors_.Warn(absl::StrCat(options_.driver, ": ", note));
    absl::StatusOr<json> items = ListSlices();
    if (!items.ok()) {
      absl::MutexLock lock(&mu_);
      status_.published = false;
      status_.last_error = std::string(items.status().message());
      return items.status();
    }
    // Ours: the first slice of our pool; any other slice of this driver on this node goes.
    const json* ours = nullptr;
    std::vector<const json*> extra;
    int64_t highest_generation = 0;
    for (const json& item : *items) {
      // Only a slice we can name can be updated or deleted (a DELETE with an empty name would be
      // one on the collection's path).
      const json* metadata = JsonMember(item, "metadata");
      if (metadata == nullptr || JsonString(*metadata, "name").value_or("").empty()) continue;
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
          json created = json::parse(response->body, nullptr, false);
          if (const json* metadata = JsonMember(created, "metadata"); metadata != nullptr) {
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
          } else if (response->status == 409) {
            conflict = true;
          } else if (TaintsRefused(devices, *response)) {
            taints_dropped = true;
          } else if (response->status != 200) {
            error = HttpError(absl::StrCat("updating ResourceSlice ", name), *response);
          } else {
            taints_dropped = TaintsDropped(devices, response->body);
            LOG(INFO) << options_.driver << ": updated ResourceSlice " << name << " (generation "
                      << generation << ", " << devices.size() << " device(s))";
          }
        }
      }
    }
    absl::MutexLock lock(&mu_);
    status_.writes += writes;
    if (taints_dropped) {
      // The slice as written offers the Unhealthy devices untainted (or was refused): write it
      // again at once without them.
      taints_dropped_ = true;
      status_.taints_dropped = true;
      LOG(WARNING) << options_.driver << ": the API server does not keep device taints (is the "
                   << "DRADeviceTaints feature gate off? it is on by default from Kubernetes "
                   << "1.36): Unhealthy devices are left out of the ResourceSlice instead of "
                   << "being published tainted, until the daemon restarts";
      continue;
    }
    if (conflict) {
      ++status_.conflicts;  // someone else wrote it since we read it: read again
      continue;
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

absl::Status SlicePublisher::RemoveAll() {
  absl::StatusOr<json> items = ListSlices();
  if (!items.ok()) return items.status();
  for (const json& item : *items) {
    const json* metadata = JsonMember(item, "metadata");
    const std::string name = metadata == nullptr ? "" : JsonString(*metadata, "name").value_or("");
    if (name.empty()) continue;  // a DELETE without a name would address the collection
    absl::StatusOr<HttpResponse> response = client_->Request("DELETE", absl::StrCat(kSlicesPath, "/", name));
    if (!response.ok()) return response.status();
    if (response->status != 200 && response->status != 202 && response->status != 404) {
      return HttpError(absl::StrCat("deleting ResourceSlice ", name), *response);
    }
    LOG(INFO) << options_.driver << ": deleted ResourceSlice " << name;
  }
  return absl::OkStatus();
}

}  // namespace edgeaccel
