#include "edgeaccel/nvml/nvml_protocol.h"

namespace edgeaccel {
namespace {

bool NeedsEscape(unsigned char c) { return c < 0x20 || c == 0x7f || c == '%' || c == '='; }

void AppendEscaped(std::string_view text, std::string* out) {
  static const char kHex[] = "0123456789ABCDEF";
  for (unsigned char c : text) {
    if (NeedsEscape(c)) {
      out->push_back('%');
      out->push_back(kHex[c >> 4]);
      out->push_back(kHex[c & 0xf]);
    } else {
      out->push_back(static_cast<char>(c));
    }
  }
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

std::optional<std::string> Unescape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '%') {
      if (i + 2 >= text.size()) return std::nullopt;
      const int high = HexValue(text[i + 1]);
      const int low = HexValue(text[i + 2]);
      if (high < 0 || low < 0) return std::nullopt;
      out.push_back(static_cast<char>(high * 16 + low));
      i += 2;
    } else if (c < 0x20 || c == 0x7f) {
      return std::nullopt;  // a raw control byte is never part of an encoded value
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

}  // namespace

std::string NvmlRecord::Get(std::string_view key) const {
  for (const auto& [k, v] : fields) {
    if (k == key) return v;
  }
  return {};
}

bool NvmlRecord::Has(std::string_view key) const {
  for (const auto& field : fields) {
    if (field.first == key) return true;
  }
  return false;
}

std::string EncodeNvmlRecord(const NvmlRecord& record) {
  std::string out;
  AppendEscaped(record.kind, &out);
  for (const auto& [key, value] : record.fields) {
    out.push_back('\t');
    AppendEscaped(key, &out);
    out.push_back('=');
    AppendEscaped(value, &out);
  }
  out.push_back('\n');
  return out;
}

std::optional<NvmlRecord> DecodeNvmlRecord(std::string_view line) {
  NvmlRecord record;
  size_t start = 0;
  bool first = true;
  while (true) {
    const size_t tab = line.find('\t', start);
    const std::string_view part =
        line.substr(start, tab == std::string_view::npos ? std::string_view::npos : tab - start);
    if (first) {
      std::optional<std::string> kind = Unescape(part);
      if (!kind.has_value() || kind->empty()) return std::nullopt;
      record.kind = std::move(*kind);
      first = false;
    } else {
      const size_t equals = part.find('=');
      if (equals == std::string_view::npos || equals == 0) return std::nullopt;
      std::optional<std::string> key = Unescape(part.substr(0, equals));
      std::optional<std::string> value = Unescape(part.substr(equals + 1));
      if (!key.has_value() || !value.has_value()) return std::nullopt;
      record.fields.emplace_back(std::move(*key), std::move(*value));
    }
    if (tab == std::string_view::npos) break;
    start = tab + 1;
  }
  return record;
}

}  // namespace edgeaccel
