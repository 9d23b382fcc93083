#include "edgeaccel/discovery/scan_inputs.h"

#include <map>
#include <memory>
#include <utility>

namespace edgeaccel {

void ScanInputs::Clear() {
  reads_.clear();
  started_ = true;
}

absl::StatusOr<std::string> ScanInputs::ReadFile(absl::string_view host_path, size_t max_bytes,
                                                 Reread reread) {
  absl::StatusOr<std::string> content = host_->ReadFile(host_path, max_bytes);
  Read read{Kind::kRead, std::string(host_path)};
  read.max_bytes = max_bytes;
  read.reread = reread;
  read.status = content.status();
  if (content.ok()) read.text = *content;
  reads_.push_back(std::move(read));
  return content;
}

absl::StatusOr<std::string> ScanInputs::ReadPart(absl::string_view host_path, Part part) {
  absl::StatusOr<std::string> content = host_->ReadFile(host_path);
  if (content.ok()) *content = part(*content);
  Read read{Kind::kRead, std::string(host_path)};
  read.max_bytes = 64 * 1024;
  read.part = part;
  read.status = content.status();
  if (content.ok()) read.text = *content;
  reads_.push_back(std::move(read));
  return content;
}

absl::StatusOr<std::string> ScanInputs::ReadAttribute(absl::string_view host_path, Reread reread) {
  return Host::AttributeOf(ReadFile(host_path, 64 * 1024, reread));
}

absl::StatusOr<int64_t> ScanInputs::ReadInteger(absl::string_view host_path, Reread reread) {
  return Host::IntegerOf(host_path, ReadFile(host_path, 64 * 1024, reread));
}

absl::StatusOr<std::vector<std::string>> ScanInputs::ListDirectory(absl::string_view host_path) {
  absl::StatusOr<std::vector<std::string>> names = host_->ListDirectory(host_path);
  Read read{Kind::kList, std::string(host_path)};
  read.status = names.status();
  if (names.ok()) read.names = *names;
  reads_.push_back(std::move(read));
  return names;
}

absl::StatusOr<FileInfo> ScanInputs::Stat(absl::string_view host_path) {
  absl::StatusOr<FileInfo> info = host_->Stat(host_path);
  Read read{Kind::kStat, std::string(host_path)};
  read.status = info.status();
  if (info.ok()) read.info = *info;
  reads_.push_back(std::move(read));
  return info;
}

absl::StatusOr<FileInfo> ScanInputs::Lstat(absl::string_view host_path) {
  absl::StatusOr<FileInfo> info = host_->Lstat(host_path);
  Read read{Kind::kLstat, std::string(host_path)};
  read.status = info.status();
  if (info.ok()) read.info = *info;
  reads_.push_back(std::move(read));
  return info;
}

bool ScanInputs::Exists(absl::string_view host_path) {
  const bool exists = host_->Exists(host_path);
  Read read{Kind::kExists, std::string(host_path)};
  read.exists = exists;
  reads_.push_back(std::move(read));
  return exists;
}

std::string ScanInputs::ResolveHostPath(absl::string_view host_path) {
  std::string resolved = host_->ResolveHostPath(host_path);
  Read read{Kind::kResolve, std::string(host_path)};
  read.text = resolved;
  reads_.push_back(std::move(read));
  return resolved;
}

namespace {

// The directory a path's last step is in ("/" for "/etc"), and that step; false where the path has
// no plain last step ("/", "x/..").
bool SplitPath(const std::string& path, std::string* parent, absl::string_view* name) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return false;
  *name = absl::string_view(path).substr(slash + 1);
  if (name->empty() || *name == "." || *name == "..") return false;
  *parent = slash == 0 ? "/" : path.substr(0, slash);
  return true;
}

}  // namespace

bool ScanInputs::Unchanged() const {
  if (!started_) return false;
  // A directory with more than one entry to look at is resolved once, for this look; an entry
  // alone in its directory is read by its path.
  std::map<std::string, int> entries_in;
  for (const Read& read : reads_) {
    if (read.reread == Reread::kUntilRead && read.status.ok()) continue;
    std::string parent;
    absl::string_view name;
    if (read.kind != Kind::kList && read.kind != Kind::kResolve &&
        SplitPath(read.path, &parent, &name)) {
      ++entries_in[parent];
    }
  }
  std::map<std::string, std::unique_ptr<HostDirectory>> directories;
  // The directory `path` is read through, and its entry's name; null: read the path whole.
  auto split = [&](const std::string& path, absl::string_view* name) -> const HostDirectory* {
    std::string parent;
    if (!SplitPath(path, &parent, name) || entries_in[parent] < 2) return nullptr;
    auto it = directories.find(parent);
    if (it == directories.end()) {
      it = directories.emplace(parent, std::make_unique<HostDirectory>(host_, parent)).first;
    }
    return it->second.get();
  };
  for (const Read& read : reads_) {
    absl::string_view name;
    switch (read.kind) {
      case Kind::kRead: {
        if (read.reread == Reread::kUntilRead && read.status.ok()) break;
        const HostDirectory* directory = split(read.path, &name);
        absl::StatusOr<std::string> content = directory != nullptr
                                                  ? directory->ReadFile(name, read.max_bytes)
                                                  : host_->ReadFile(read.path, read.max_bytes);
        if (content.ok() && read.part != nullptr) *content = read.part(*content);
        if (content.status() != read.status || (content.ok() && *content != read.text)) {
          return false;
        }
        break;
      }
      case Kind::kList: {
        absl::StatusOr<std::vector<std::string>> names = host_->ListDirectory(read.path);
        if (names.status() != read.status || (names.ok() && *names != read.names)) return false;
        break;
      }
      case Kind::kStat:
      case Kind::kLstat: {
        const HostDirectory* directory = split(read.path, &name);
        const bool lstat = read.kind == Kind::kLstat;
        absl::StatusOr<FileInfo> info =
            directory != nullptr ? (lstat ? directory->Lstat(name) : directory->Stat(name))
                                 : (lstat ? host_->Lstat(read.path) : host_->Stat(read.path));
        if (info.status() != read.status || (info.ok() && *info != read.info)) return false;
        break;
      }
      case Kind::kExists: {
        const HostDirectory* directory = split(read.path, &name);
        const bool exists =
            directory != nullptr ? directory->Exists(name) : host_->Exists(read.path);
        if (exists != read.exists) return false;
        break;
      }
      case Kind::kResolve:
        if (host_->ResolveHostPath(read.path) != read.text) return false;
        break;
    }
  }
  return true;
}

}  // namespace edgeaccel
