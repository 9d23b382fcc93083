// The process's own glog lines, as an operator reading `kubectl logs` would see them, for tests
// of in-process modules (tests of the daemon binary read its stderr instead).
#ifndef EDGEACCEL_TESTS_SUPPORT_CAPTURED_LOG_H_
#define EDGEACCEL_TESTS_SUPPORT_CAPTURED_LOG_H_

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "glog/logging.h"

namespace edgeaccel::testing {

// How many times `what` stands in `text` (a daemon's log, a metrics page).
inline size_t Occurrences(const std::string& text, const std::string& what) {
  size_t count = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++count;
  return count;
}

// Captures every line logged while it exists, as "SEVERITY: message".
class CapturedLog : public google::LogSink {
 public:
  CapturedLog() { google::AddLogSink(this); }
  ~CapturedLog() override { google::RemoveLogSink(this); }
  CapturedLog(const CapturedLog&) = delete;
  CapturedLog& operator=(const CapturedLog&) = delete;

  void send(google::LogSeverity severity, const char*, const char*, int,
            const google::LogMessageTime&, const char* message, size_t length) override {
    absl::MutexLock lock(&mu_);
    lines_.push_back(std::string(google::GetLogSeverityName(severity)) + ": " +
                     std::string(message, length));
  }
  // How many lines contain `text`.
  int Count(const std::string& text) const {
    absl::MutexLock lock(&mu_);
    int count = 0;
    for (const std::string& line : lines_) count += line.find(text) != std::string::npos;
    return count;
  }
  bool Contains(const std::string& text) const { return Count(text) > 0; }
  // Every line, for a failing check's message.
  std::string Text() const {
    absl::MutexLock lock(&mu_);
    std::string text;
    for (const std::string& line : lines_) text += line + "\n";
    return text;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

}  // namespace edgeaccel::testing

#endif  // EDGEACCEL_TESTS_SUPPORT_CAPTURED_LOG_H_
