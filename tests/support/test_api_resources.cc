// resource.k8s.io/v1 for TestApiServer (its header says what is served): ResourceClaims for
// NodePrepareResources and ResourceSlices for the driver's publisher, as kube-apiserver 1.34-1.36
// answers them. Sources, kubernetes/kubernetes unless said (paraphrased, no code copied):
//  * decoding: a value of the wrong JSON type, a bad quantity, an apiVersion or kind that is not
//    resource.k8s.io/v1 ResourceSlice are 400 BadRequest ("ResourceSlice in version "v1" cannot
//    be handled as a ResourceSlice: ...", staging/src/k8s.io/apiserver/pkg/endpoints/handlers/
//    create.go, transformDecodeError); unknown fields are dropped with a Warning header
//    (fieldValidation Warn, the default), or 400 "strict decoding error: unknown field ..." with
//    ?fieldValidation=Strict (handlers/create.go and update.go, KEP-2885);
//  * quantities: ParseQuantity and the canonical String() of
//    staging/src/k8s.io/apimachinery/pkg/api/resource/quantity.go (1024Mi is stored as 1Gi);
//  * validation: pkg/apis/resource/validation/validation.go (ValidateResourceSlice,
//    validateResourceSliceSpec, validateResourcePool, validateDevice, validateDeviceAttribute,
//    validateQualifiedName, validateCIdentifier, validateSet/validateMap), the name checks of
//    staging/src/k8s.io/apimachinery/pkg/util/validation/validation.go, ValidateObjectMeta and
//    ValidateOwnerReferences (apimachinery/pkg/api/validation/objectmeta.go), the messages of
//    apimachinery/pkg/util/validation/field/errors.go and the 422 body of
//    apimachinery/pkg/api/errors/errors.go (NewInvalid); limits as /work/shared/dra-facts.md §4;
//  * the strategy: pkg/registry/resource/resourceslice/strategy.go (cluster-scoped, generation 1
//    on create and +1 when the spec changes, AllowCreateOnUpdate false,
//    AllowUnconditionalUpdate true); field selectors spec.driver, spec.nodeName, metadata.name
//    (pkg/apis/resource/v1/conversion.go; another is 400 "field label not supported ...");
//  * the store: staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go and
//    storage/etcd3/store.go (409 Conflict on a stale resourceVersion, preconditions uid and
//    resourceVersion on DELETE and the object's uid on PUT, 409 AlreadyExists, 500 for a create
//    that carries a resourceVersion, an update that changes nothing is not written), generateName
//    (storage/names/generate.go: the base cut to 58, 5 characters of utilrand's alphabet);
//  * claims: what NodePrepareResources reads (dra-facts.md §6).
#include <httplib.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <regex>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "test_api_server.h"

namespace edgeaccel::testing {
namespace {

using json = nlohmann::json;

constexpr char kGroup[] = "resource.k8s.io";
constexpr char kApiVersion[] = "resource.k8s.io/v1";
constexpr char kSlicesPattern[] = R"(/apis/resource\.k8s\.io/v1/resourceslices)";
constexpr char kSlicePattern[] = R"(/apis/resource\.k8s\.io/v1/resourceslices/([^/]+))";
constexpr char kClaimPattern[] =
    R"(/apis/resource\.k8s\.io/v1/namespaces/([^/]+)/resourceclaims/([^/]+))";

// ---------------------------------------------------------------------------------------------
// Answers: a metav1.Status as the API server writes it (apimachinery/pkg/api/errors).

void Answer(httplib::Response& res, int code, const std::string& reason,
            const std::string& message, const json& details = nullptr) {
  json status = {{"kind", "Status"},   {"apiVersion", "v1"},  {"metadata", json::object()},
                 {"status", "Failure"}, {"message", message}, {"reason", reason},
                 {"code", code}};
  if (!details.is_null()) status["details"] = details;
  res.status = code;
  res.set_content(status.dump(), "application/json");
}

json Details(const std::string& name, const std::string& kind) {
  return {{"name", name}, {"group", kGroup}, {"kind", kind}};
}

std::string Quote(const std::string& text) { return json(text).dump(); }

void NotFound(httplib::Response& res, const std::string& resource, const std::string& name) {
  Answer(res, 404, "NotFound",
         absl::StrCat(resource, ".", kGroup, " ", Quote(name), " not found"),
         Details(name, resource));
}

// NewConflict: "Operation cannot be fulfilled on <resource>.<group> "<name>": <why>".
void Conflict(httplib::Response& res, const std::string& name, const std::string& why) {
  Answer(res, 409, "Conflict",
         absl::StrCat("Operation cannot be fulfilled on resourceslices.", kGroup, " ", Quote(name),
                      ": ", why),
         Details(name, "resourceslices"));
}

constexpr char kModified[] =
    "the object has been modified; please apply your changes to the latest version and try again";

// A failed storage precondition, as etcd3's store reports it (storage.Preconditions.Check).
std::string PreconditionFailed(const std::string& name, const std::string& what,
                               const std::string& wanted, const std::string& stored) {
  return absl::StrCat("StorageError: invalid object, Code: 4, Key: /registry/resourceslices/",
                      name, ", ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: ",
                      what, " in precondition: ", wanted, ", ", what, " in object meta: ", stored);
}

// The reason and message of a status a test injects.
void AnswerInjected(httplib::Response& res, int code) {
  struct Known {
    int code;
    const char* reason;
    const char* message;
  };
  static constexpr Known kKnown[] = {
      {400, "BadRequest", "the request is invalid (injected by the test)"},
      {401, "Unauthorized", "Unauthorized"},
      {403, "Forbidden", "forbidden (injected by the test)"},
      {404, "NotFound", "the server could not find the requested resource"},
      {409, "Conflict", "the object has been modified (injected by the test)"},
      {410, "Expired", "the resource has expired (injected by the test)"},
      {422, "Invalid", "the object is invalid (injected by the test)"},
      {429, "TooManyRequests", "Too many requests, please try again later."},
      {500, "InternalError", "Internal error occurred: injected by the test"},
      {503, "ServiceUnavailable", "the server is currently unable to handle the request"},
      {504, "Timeout", "the server was unable to return a response in the time allotted"},
  };
  for (const Known& known : kKnown) {
    if (known.code == code) {
      if (code == 429) res.set_header("Retry-After", "1");
      return Answer(res, code, known.reason, known.message);
    }
  }
  Answer(res, code, "", "injected by the test");
}

// The media type without parameters ("; charset=utf-8"), as the API server compares it.
std::string MediaType(const httplib::Request& req) {
  std::string type = req.get_header_value("Content-Type");
  type = type.substr(0, type.find(';'));
  return std::string(absl::StripAsciiWhitespace(type));
}

// A query parameter's first value, parsed from the request's target as Go's url.ParseQuery
// does: pairs split at '&', each at its first '=', %XX and '+' decoded (a pair with a bad escape
// is dropped). cpp-httplib's own parse keeps what follows a second '=' only
// ("fieldSelector=spec.nodeName=n" would read as "n").
std::string Query(const httplib::Request& req, const std::string& name) {
  const size_t mark = req.target.find('?');
  if (mark == std::string::npos) return "";
  auto decode = [](absl::string_view text, std::string& out) {
    out.clear();
    for (size_t i = 0; i < text.size(); i++) {
      if (text[i] == '+') {
        out += ' ';
      } else if (text[i] != '%') {
        out += text[i];
      } else if (i + 2 < text.size() && absl::ascii_isxdigit(text[i + 1]) &&
                 absl::ascii_isxdigit(text[i + 2])) {
        out += static_cast<char>(std::stoi(std::string(text.substr(i + 1, 2)), nullptr, 16));
        i += 2;
      } else {
        return false;
      }
    }
    return true;
  };
  const absl::string_view query = absl::string_view(req.target).substr(mark + 1);
  for (absl::string_view pair : absl::StrSplit(query, '&')) {
    const size_t equals = pair.find('=');
    std::string key, value;
    if (!decode(pair.substr(0, equals), key)) continue;
    if (equals != absl::string_view::npos && !decode(pair.substr(equals + 1), value)) continue;
    if (key == name) return value;
  }
  return "";
}

void RefuseMediaType(httplib::Response& res) {
  Answer(res, 415, "UnsupportedMediaType",
         "the body of the request was in an unknown format - accepted media types include: "
         "application/json, application/yaml, application/vnd.kubernetes.protobuf");
}

std::string Now() {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
}

// A random (version 4) UUID in its normalized form, as metadata.uid is.
std::string NewUid() {
  thread_local std::mt19937_64 random(std::random_device{}());
  const uint64_t high = random(), low = random();
  char text[37];
  snprintf(text, sizeof text, "%08x-%04x-4%03x-%04x-%012llx",
           static_cast<unsigned>(high >> 32), static_cast<unsigned>((high >> 16) & 0xffff),
           static_cast<unsigned>(high & 0xfff),
           static_cast<unsigned>(0x8000 | ((low >> 48) & 0x3fff)),
           static_cast<unsigned long long>(low & 0xffffffffffffULL));
  return text;
}

// metadata.<field> when it is a string, else "".
std::string Meta(const json& object, const char* field) {
  if (!object.is_object()) return "";
  auto metadata = object.find("metadata");
  if (metadata == object.end() || !metadata->is_object()) return "";
  auto value = metadata->find(field);
  return value != metadata->end() && value->is_string() ? value->get<std::string>() : "";
}

// object.<field> when it is a string, else "".
std::string StringAt(const json& object, const char* field) {
  if (!object.is_object()) return "";
  auto it = object.find(field);
  return it != object.end() && it->is_string() ? it->get<std::string>() : "";
}

// A list item as the API server writes it: without kind and apiVersion.
json ListItem(json object) {
  object.erase("kind");
  object.erase("apiVersion");
  return object;
}

// ---------------------------------------------------------------------------------------------
// Names (apimachinery/pkg/util/validation/validation.go).

bool IsLowerAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

bool MatchesLabel(absl::string_view text) {
  if (text.empty() || !IsLowerAlnum(text.front()) || !IsLowerAlnum(text.back())) return false;
  return std::all_of(text.begin(), text.end(),
                     [](char c) { return IsLowerAlnum(c) || c == '-'; });
}

bool MatchesSubdomain(absl::string_view text) {
  if (text.empty()) return false;
  for (absl::string_view label : absl::StrSplit(text, '.')) {
    if (!MatchesLabel(label)) return false;
  }
  return true;
}

// RegexError: the message, its examples and the expression.
std::string RegexError(const std::string& message, const std::string& expression,
                       const std::vector<std::string>& examples) {
  std::string out = message + " (e.g. ";
  for (size_t i = 0; i < examples.size(); i++) {
    if (i > 0) out += " or ";
    out += "'" + examples[i] + "', ";
  }
  return out + "regex used for validation is '" + expression + "')";
}

constexpr char kLabelFormat[] = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";

std::vector<std::string> IsDNS1123Label(const std::string& value) {
  std::vector<std::string> errors;
  if (value.size() > 63) errors.push_back("must be no more than 63 characters");
  if (!MatchesLabel(value)) {
    errors.push_back(RegexError(
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
        "and must start and end with an alphanumeric character",
        kLabelFormat, {"my-name", "123-abc"}));
  }
  return errors;
}

std::vector<std::string> IsDNS1123Subdomain(const std::string& value) {
  std::vector<std::string> errors;
  if (value.size() > 253) errors.push_back("must be no more than 253 characters");
  if (!MatchesSubdomain(value)) {
    errors.push_back(RegexError(
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' "
        "or '.', and must start and end with an alphanumeric character",
        absl::StrCat(kLabelFormat, "(\\.", kLabelFormat, ")*"), {"example.com"}));
  }
  return errors;
}

std::vector<std::string> IsCIdentifier(const std::string& value) {
  const bool valid =
      !value.empty() && (absl::ascii_isalpha(value[0]) || value[0] == '_') &&
      std::all_of(value.begin(), value.end(),
                  [](char c) { return absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
                                      c == '_'; });
  if (valid) return {};
  return {RegexError("a valid C identifier must start with alphabetic character or '_', "
                     "followed by a string of alphanumeric characters or '_'",
                     "[A-Za-z_][A-Za-z0-9_]*", {"my_name", "MY_NAME", "MyName"})};
}

constexpr char kQualifiedNameFormat[] = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";

bool MatchesQualifiedNamePart(const std::string& value) {
  static const std::regex re(kQualifiedNameFormat);
  return std::regex_match(value, re);
}

// IsValidLabelValue (apimachinery/pkg/util/validation/validation.go): empty, or at most 63
// characters of [A-Za-z0-9-_.] starting and ending alphanumeric.
std::vector<std::string> IsLabelValue(const std::string& value) {
  std::vector<std::string> errors;
  if (value.size() > 63) errors.push_back("must be no more than 63 characters");
  if (!value.empty() && !MatchesQualifiedNamePart(value)) {
    errors.push_back(RegexError(
        "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' "
        "or '.', and must start and end with an alphanumeric character",
        "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?", {"MyValue", "my_value", "12345"}));
  }
  return errors;
}

// IsQualifiedName (what ValidateLabelName checks): [DNS subdomain prefix/]name, the name at most
// 63 characters of [A-Za-z0-9-_.] starting and ending alphanumeric.
std::vector<std::string> IsQualifiedName(const std::string& value) {
  std::vector<std::string> errors;
  const std::vector<std::string> parts = absl::StrSplit(value, '/');
  std::string name = parts.back();
  if (parts.size() > 2) {
    return {"a qualified name must consist of alphanumeric characters, '-', '_' or '.', and "
            "must start and end with an alphanumeric character, with an optional DNS subdomain "
            "prefix and '/'"};
  }
  if (parts.size() == 2) {
    if (parts[0].empty()) errors.push_back("prefix part must be non-empty");
    for (const std::string& message : IsDNS1123Subdomain(parts[0])) {
      errors.push_back("prefix part " + message);
    }
  }
  if (name.empty()) errors.push_back("name part must be non-empty");
  if (name.size() > 63) errors.push_back("name part must be no more than 63 characters");
  if (!name.empty() && !MatchesQualifiedNamePart(name)) {
    errors.push_back(RegexError(
        "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and "
        "end with an alphanumeric character",
        kQualifiedNameFormat, {"MyName", "my.name", "123-abc"}));
  }
  return errors;
}

// Semantic versioning 2.0.0 (validation.go's semverRe): MAJOR.MINOR.PATCH without leading zeros,
// an optional pre-release and build.
bool IsSemver(const std::string& value) {
  static const std::regex kSemver(
      R"(^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*))"
      R"((-(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(\.(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*)?)"
      R"((\+[0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*)?$)");
  return value.size() <= 4096 && std::regex_match(value, kSemver);
}

// ---------------------------------------------------------------------------------------------
// Quantities (apimachinery/pkg/api/resource/quantity.go): ParseQuantity, then String().

constexpr char kQuantityFormat[] =
    "quantities must match the regular expression "
    "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";

using Wide = unsigned __int128;

bool Multiply(Wide& value, Wide by) {
  if (value != 0 && by > ~Wide(0) / value) return false;
  value *= by;
  return true;
}

bool PowerOfTen(int exponent, Wide& out) {
  out = 1;
  for (int i = 0; i < exponent; i++) {
    if (!Multiply(out, 10)) return false;
  }
  return true;
}

std::string WideToString(Wide value) {
  if (value == 0) return "0";
  std::string out;
  while (value != 0) {
    out.push_back(static_cast<char>('0' + static_cast<int>(value % 10)));
    value /= 10;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Parses `text` as ParseQuantity does; false with its error. `canonical` is what the API server
// stores and answers (Quantity.String()); a value too large for this stand-in's arithmetic is
// kept as sent.
bool CanonicalQuantity(const std::string& sent, std::string& canonical, std::string& error) {
  const std::string text(absl::StripAsciiWhitespace(sent));
  canonical = text;
  if (text.empty()) {
    error = kQuantityFormat;
    return false;
  }
  // parseQuantityString: sign, numerator (leading zeros dropped), denominator, suffix.
  bool positive = true;
  size_t pos = 0;
  const size_t end = text.size();
  std::string num, denom, suffix;
  if (text[0] == '-' || text[0] == '+') {
    positive = text[0] == '+';
    pos++;
  }
  bool done = false;
  while (pos < end && text[pos] == '0') pos++;
  const bool zeros_only = pos >= end;  // a sign and zeros, or a sign alone: zero
  if (zeros_only) {
    num = "0";
    done = true;
  }
  if (!done) {
    size_t i = pos;
    while (i < end && IsDigit(text[i])) i++;
    num = text.substr(pos, i - pos);
    pos = i;
    done = pos >= end;
  }
  if (!done && text[pos] == '.') {
    size_t i = ++pos;
    while (i < end && IsDigit(text[i])) i++;
    denom = text.substr(pos, i - pos);
    pos = i;
    done = pos >= end;
  }
  if (!done) {
    const size_t suffix_start = pos;
    while (pos < end && strchr("eEinumkKMGTP", text[pos]) != nullptr) pos++;
    if (pos < end && (text[pos] == '-' || text[pos] == '+')) pos++;
    while (pos < end && IsDigit(text[pos])) pos++;
    if (pos < end) {
      error = kQuantityFormat;
      return false;
    }
    suffix = text.substr(suffix_start);
  }
  // The numeric part must be a number (inf.Dec's SetString): some digit.
  const size_t value_end = text.size() - suffix.size();
  if (!zeros_only &&
      std::none_of(text.begin(), text.begin() + static_cast<ptrdiff_t>(value_end), IsDigit)) {
    error = "unable to parse numeric part of quantity";
    return false;
  }
  // The suffix: decimal SI, binary SI or a decimal exponent.
  enum class Format { kDecimalSI, kBinarySI, kDecimalExponent } format = Format::kDecimalSI;
  int base = 10, exponent = 0;
  static const std::pair<const char*, int> kDecimal[] = {
      {"n", -9}, {"u", -6}, {"m", -3}, {"", 0}, {"k", 3}, {"M", 6}, {"G", 9}, {"T", 12},
      {"P", 15}, {"E", 18}};
  static const std::pair<const char*, int> kBinary[] = {
      {"Ki", 10}, {"Mi", 20}, {"Gi", 30}, {"Ti", 40}, {"Pi", 50}, {"Ei", 60}};
  bool known = false;
  for (const auto& [name, power] : kDecimal) {
    if (suffix == name) {
      known = true;
      exponent = power;
    }
  }
  for (const auto& [name, power] : kBinary) {
    if (suffix == name) {
      known = true;
      base = 2;
      exponent = power;
      format = Format::kBinarySI;
    }
  }
  if (!known && suffix.size() > 1 && (suffix[0] == 'e' || suffix[0] == 'E')) {
    int32_t power = 0;
    if (absl::SimpleAtoi(suffix.substr(1), &power)) {
      known = true;
      exponent = power;
      format = Format::kDecimalExponent;
    }
  }
  if (!known) {
    error = "unable to parse quantity's suffix";
    return false;
  }
  // The exact value: mantissa * 10^scale.
  std::string digits = num + denom;
  digits.erase(0, std::min(digits.find_first_not_of('0'), digits.size()));
  if (digits.empty()) {
    canonical = "0";
    return true;
  }
  if (digits.size() > 38) return true;  // kept as sent
  Wide mantissa = 0;
  for (char c : digits) mantissa = mantissa * 10 + static_cast<unsigned>(c - '0');
  long scale = -static_cast<long>(denom.size());
  if (base == 10) {
    scale += exponent;
  } else if (!Multiply(mantissa, Wide(1) << exponent)) {
    return true;
  }
  // Rounded up to the nano (away from zero).
  if (scale < -9) {
    Wide divisor;
    if (!PowerOfTen(static_cast<int>(-9 - scale), divisor)) {
      mantissa = 1;
    } else {
      mantissa = mantissa / divisor + (mantissa % divisor != 0 ? 1 : 0);
    }
    scale = -9;
  }
  const std::string sign = positive ? "" : "-";
  if (format == Format::kBinarySI) {
    // Below 1024 it is written as a decimal; else as an integer times a power of 1024 when it is
    // an integer.
    Wide power, whole = 0;
    bool integer = false, small = false;
    if (scale >= 0) {
      if (!PowerOfTen(static_cast<int>(scale), power)) return true;
      whole = mantissa;
      if (!Multiply(whole, power)) return true;
      integer = true;
      small = whole < 1024;
    } else if (PowerOfTen(static_cast<int>(-scale), power)) {
      integer = mantissa % power == 0;
      whole = mantissa / power;
      Wide limit = 1024;
      small = !Multiply(limit, power) || mantissa < limit;
    } else {
      small = true;
    }
    if (small || !integer) {
      format = Format::kDecimalSI;
    } else {
      int step = 0;
      while (whole % 1024 == 0) {
        whole /= 1024;
        step++;
      }
      if (step > 6) return true;
      canonical = sign + WideToString(whole) + (step == 0 ? "" : kBinary[step - 1].first);
      return true;
    }
  }
  while (mantissa % 10 == 0) {
    mantissa /= 10;
    scale++;
  }
  const long rest = scale % 3;
  if (rest == 1 || rest == -2) {
    if (!Multiply(mantissa, 10)) return true;
    scale -= 1;
  } else if (rest == 2 || rest == -1) {
    if (!Multiply(mantissa, 100)) return true;
    scale -= 2;
  }
  if (format == Format::kDecimalExponent) {
    canonical = sign + WideToString(mantissa) + (scale == 0 ? "" : absl::StrCat("e", scale));
    return true;
  }
  for (const auto& [name, power] : kDecimal) {
    if (power == scale) {
      canonical = sign + WideToString(mantissa) + name;
      return true;
    }
  }
  return true;  // beyond E or below n: kept as sent
}

// ---------------------------------------------------------------------------------------------
// Decoding: what Go's decoder keeps of a ResourceSlice (API resource/v1 types.go, 1.34-1.36).

struct Schema {
  enum Kind { kString, kInt, kBool, kQuantity, kAny, kStruct, kList, kMap };
  Kind kind;
  std::string go_type;  // for the decoder's error message
  std::vector<std::pair<std::string, const Schema*>> fields;  // kStruct
  const Schema* element = nullptr;                             // kList, kMap
};

const Schema& SliceSchema() {
  static const Schema* const schema = [] {
    using S = Schema;
    auto* text = new S{S::kString, "string", {}};
    auto* integer = new S{S::kInt, "int64", {}};
    auto* boolean = new S{S::kBool, "bool", {}};
    auto* quantity = new S{S::kQuantity, "resource.Quantity", {}};
    auto* any = new S{S::kAny, "", {}};
    auto* texts = new S{S::kList, "[]string", {}, text};
    auto* text_map = new S{S::kMap, "map[string]string", {}, text};
    auto* owner = new S{S::kStruct, "OwnerReference",
                        {{"apiVersion", text}, {"kind", text}, {"name", text}, {"uid", text},
                         {"controller", boolean}, {"blockOwnerDeletion", boolean}}};
    auto* owners = new S{S::kList, "[]v1.OwnerReference", {}, owner};
    auto* meta = new S{S::kStruct, "ObjectMeta",
                       {{"name", text}, {"generateName", text}, {"namespace", text},
                        {"selfLink", text}, {"uid", text}, {"resourceVersion", text},
                        {"generation", integer}, {"creationTimestamp", any},
                        {"deletionTimestamp", any}, {"deletionGracePeriodSeconds", integer},
                        {"labels", text_map}, {"annotations", text_map},
                        {"ownerReferences", owners}, {"finalizers", texts},
                        {"managedFields", any}}};
    auto* pool = new S{S::kStruct, "ResourcePool",
                       {{"name", text}, {"generation", integer}, {"resourceSliceCount", integer}}};
    auto* attribute = new S{S::kStruct, "DeviceAttribute",
                            {{"int", integer}, {"bool", boolean}, {"string", text},
                             {"version", text}}};
    auto* capacity = new S{S::kStruct, "DeviceCapacity",
                           {{"value", quantity}, {"requestPolicy", any}}};
    auto* device = new S{
        S::kStruct, "Device",
        {{"name", text},
         {"attributes", new S{S::kMap, "map[v1.QualifiedName]v1.DeviceAttribute", {}, attribute}},
         {"capacity", new S{S::kMap, "map[v1.QualifiedName]v1.DeviceCapacity", {}, capacity}},
         {"consumesCounters", any}, {"nodeName", text}, {"nodeSelector", any},
         {"allNodes", boolean}, {"taints", any}, {"bindsToNode", boolean},
         {"bindingConditions", texts}, {"bindingFailureConditions", texts},
         {"allowMultipleAllocations", boolean}}};
    auto* spec = new S{S::kStruct, "ResourceSliceSpec",
                       {{"driver", text}, {"pool", pool}, {"nodeName", text},
                        {"nodeSelector", any}, {"allNodes", boolean},
                        {"devices", new S{S::kList, "[]v1.Device", {}, device}},
                        {"perDeviceNodeSelection", boolean}, {"sharedCounters", any}}};
    return new S{S::kStruct, "ResourceSlice",
                 {{"apiVersion", text}, {"kind", text}, {"metadata", meta}, {"spec", spec}}};
  }();
  return *schema;
}

struct Decoding {
  std::vector<std::string> unknown;  // the paths of the fields dropped
  std::string error;                 // the first error
};

std::string JsonType(const json& value) {
  if (value.is_boolean()) return "bool";
  if (value.is_number()) return "number " + value.dump();
  return value.type_name();
}

// Makes `value` what decoding it into `schema` and encoding it again gives: unknown fields and
// nulls dropped, quantities canonical. False with the decoder's error. `go_struct` and `go_path`
// name the field as Go's decoder does in its errors.
bool Decode(json& value, const Schema& schema, const std::string& path,
            const std::string& go_struct, const std::string& go_path, Decoding& out) {
  auto type_error = [&] {
    out.error = absl::StrCat("json: cannot unmarshal ", JsonType(value), " into Go struct field ",
                             go_struct, ".", go_path, " of type ", schema.go_type);
    return false;
  };
  switch (schema.kind) {
    case Schema::kString:
      return value.is_string() || type_error();
    case Schema::kBool:
      return value.is_boolean() || type_error();
    case Schema::kInt:
      if (!value.is_number_integer()) return type_error();
      if (value.is_number_unsigned() && value.get<uint64_t>() > INT64_MAX) return type_error();
      return true;
    case Schema::kQuantity: {
      std::string canonical;
      if (!CanonicalQuantity(value.is_string() ? value.get<std::string>() : value.dump(),
                             canonical, out.error)) {
        return false;
      }
      value = canonical;
      return true;
    }
    case Schema::kAny:
      return true;
    case Schema::kStruct:
      if (!value.is_object()) return type_error();
      for (auto it = value.begin(); it != value.end();) {
        const std::string key = it.key();
        const std::string child = path.empty() ? key : path + "." + key;
        auto field = std::find_if(schema.fields.begin(), schema.fields.end(),
                                  [&](const auto& f) { return f.first == key; });
        if (field == schema.fields.end()) {
          out.unknown.push_back(child);
          it = value.erase(it);
        } else if (it->is_null()) {
          it = value.erase(it);
        } else if (!Decode(*it, *field->second, child, schema.go_type,
                           go_path.empty() ? key : go_path + "." + key, out)) {
          return false;
        } else {
          ++it;
        }
      }
      return true;
    case Schema::kList:
      if (!value.is_array()) return type_error();
      for (size_t i = 0; i < value.size(); i++) {
        if (value[i].is_null()) {
          value[i] = schema.element->kind == Schema::kStruct ? json::object() : json("");
        }
        if (!Decode(value[i], *schema.element, absl::StrCat(path, "[", i, "]"), go_struct,
                    go_path, out)) {
          return false;
        }
      }
      return true;
    case Schema::kMap:
      if (!value.is_object()) return type_error();
      for (auto it = value.begin(); it != value.end(); ++it) {
        if (it->is_null()) {
          *it = schema.element->kind == Schema::kStruct ? json::object() : json("");
        }
        if (!Decode(*it, *schema.element, absl::StrCat(path, "[", it.key(), "]"), go_struct,
                    go_path + "." + it.key(), out)) {
          return false;
        }
      }
      return true;
  }
  return true;
}

// ?fieldValidation: Ignore, Warn (the default) or Strict; another is 422 (ValidateCreateOptions
// and ValidateUpdateOptions). False with the error answered.
bool FieldValidation(const httplib::Request& req, const char* options, std::string& directive,
                     httplib::Response& res) {
  directive = Query(req, "fieldValidation");
  if (directive.empty()) directive = "Warn";
  if (directive == "Ignore" || directive == "Warn" || directive == "Strict") return true;
  const std::string body =
      absl::StrCat("Unsupported value: ", Quote(directive),
                   ": supported values: \"\", \"Ignore\", \"Strict\", \"Warn\"");
  json cause = {
      {"reason", "FieldValueNotSupported"}, {"message", body}, {"field", "fieldValidation"}};
  json details = {{"group", "meta.k8s.io"}, {"kind", options}};
  details["causes"] = json::array({cause});
  Answer(res, 422, "Invalid",
         absl::StrCat(options, ".meta.k8s.io \"\" is invalid: fieldValidation: ", body), details);
  return false;
}

// The request's body as the server decodes a ResourceSlice. False with the 400 answered.
bool DecodeSlice(const httplib::Request& req, const std::string& directive, json& slice,
                 httplib::Response& res) {
  slice = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (slice.is_discarded() || !slice.is_object()) {
    Answer(res, 400, "BadRequest",
           "couldn't get version/kind; json parse error: the request body is not a JSON object");
    return false;
  }
  Decoding decoding;
  if (!Decode(slice, SliceSchema(), "", "ResourceSlice", "", decoding)) {
    Answer(res, 400, "BadRequest",
           "ResourceSlice in version \"v1\" cannot be handled as a ResourceSlice: " +
               decoding.error);
    return false;
  }
  const std::string api_version = StringAt(slice, "apiVersion");
  const std::string kind = StringAt(slice, "kind");
  if (!kind.empty() && kind != "ResourceSlice") {
    Answer(res, 400, "BadRequest",
           absl::StrCat("no kind ", Quote(kind), " is registered for version ",
                        Quote(api_version.empty() ? kApiVersion : api_version),
                        " in scheme \"pkg/api/legacyscheme/scheme.go:30\""));
    return false;
  }
  if (!api_version.empty() && api_version != kApiVersion) {
    Answer(res, 400, "BadRequest",
           absl::StrCat("the API version in the data (", api_version,
                        ") does not match the expected API version (", kApiVersion, ")"));
    return false;
  }
  std::vector<std::string> unknown;
  for (const std::string& path : decoding.unknown) {
    unknown.push_back(absl::StrCat("unknown field ", Quote(path)));
  }
  if (!unknown.empty() && directive == "Strict") {
    Answer(res, 400, "BadRequest",
           "ResourceSlice in version \"v1\" cannot be handled as a ResourceSlice: strict decoding "
           "error: " + absl::StrJoin(unknown, ", "));
    return false;
  }
  if (directive == "Warn") {
    for (const std::string& warning : unknown) {
      res.set_header("Warning", absl::StrCat("299 - ", Quote(warning)));
    }
  }
  if (!slice.contains("metadata")) slice["metadata"] = json::object();
  if (!slice.contains("spec")) slice["spec"] = json::object();
  // The strategy's WarningsOnCreate and WarningsOnUpdate.
  const std::string driver = StringAt(slice["spec"], "driver");
  if (driver != absl::AsciiStrToLower(driver)) {
    res.set_header("Warning",
                   absl::StrCat("299 - ", Quote(absl::StrCat("spec.driver: driver names should be "
                                                             "lowercase; ", Quote(driver),
                                                             " contains uppercase characters"))));
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Validation (validation.go; field.Error's messages).

struct FieldError {
  std::string type;   // the cause's reason: FieldValueInvalid, ...
  std::string field;  // spec.devices[0].name
  std::string body;   // the message without the field: "Invalid value: ..."
};
using Errors = std::vector<FieldError>;

FieldError Required(const std::string& field, const std::string& detail = "") {
  return {"FieldValueRequired", field,
          detail.empty() ? "Required value" : "Required value: " + detail};
}
// `shown` is the bad value as Go prints it: a string quoted, a number bare.
FieldError Invalid(const std::string& field, const std::string& shown, const std::string& detail) {
  return {"FieldValueInvalid", field, absl::StrCat("Invalid value: ", shown, ": ", detail)};
}
FieldError TooLong(const std::string& field, int max) {
  return {"FieldValueTooLong", field, absl::StrCat("Too long: must have at most ", max, " bytes")};
}
FieldError TooMany(const std::string& field, size_t count, int max) {
  return {"FieldValueTooMany", field,
          absl::StrCat("Too many: ", count, ": must have at most ", max, " items")};
}
FieldError Duplicate(const std::string& field, const std::string& shown) {
  return {"FieldValueDuplicate", field, "Duplicate value: " + shown};
}
FieldError Forbidden(const std::string& field, const std::string& detail) {
  return {"FieldValueForbidden", field, "Forbidden: " + detail};
}

// Limits (API resource/v1 types.go; dra-facts.md §4).
constexpr int kDriverNameMaxLength = 63;
constexpr int kPoolNameMaxLength = 253;
constexpr int kMaxDevices = 128;
constexpr int kMaxDevicesWithTaintsOrCounters = 64;
constexpr int kMaxAttributesAndCapacities = 32;
constexpr int kMaxIDLength = 32;
constexpr int kMaxAttributeValueLength = 64;
// DeviceTaintsMaxLength (k8s.io/api resource/v1 types.go, Kubernetes 1.36; 4 before).
constexpr int kMaxTaints = 16;
constexpr int kQualifiedNameKeyLength = kDriverNameMaxLength + 1 + kMaxIDLength;

int64_t IntAt(const json& object, const char* field) {
  auto it = object.find(field);
  return it != object.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

// ValidateCSIDriverName, which resource's validateDriverName is.
void ValidateDriverName(const std::string& name, const std::string& field, Errors& errors) {
  if (name.empty()) errors.push_back(Required(field));
  if (name.size() > kDriverNameMaxLength) errors.push_back(TooLong(field, kDriverNameMaxLength));
  for (const std::string& message : IsDNS1123Subdomain(absl::AsciiStrToLower(name))) {
    errors.push_back(Invalid(field, Quote(name), message));
  }
}

void ValidatePoolName(const std::string& name, const std::string& field, Errors& errors) {
  if (name.empty()) {
    errors.push_back(Required(field));
    return;
  }
  if (name.size() > kPoolNameMaxLength) errors.push_back(TooLong(field, kPoolNameMaxLength));
  for (const std::string& part : std::vector<std::string>(absl::StrSplit(name, '/'))) {
    for (const std::string& message : IsDNS1123Subdomain(part)) {
      errors.push_back(Invalid(field, Quote(part), message));
    }
  }
}

void ValidateNodeName(const std::string& name, const std::string& field, Errors& errors) {
  for (const std::string& message : IsDNS1123Subdomain(name)) {
    errors.push_back(Invalid(field, Quote(name), message));
  }
}

void ValidateCIdentifier(const std::string& id, const std::string& field, Errors& errors) {
  if (id.size() > kMaxIDLength) errors.push_back(TooLong(field, kMaxIDLength));
  for (const std::string& message : IsCIdentifier(id)) {
    errors.push_back(Invalid(field, Quote(id), message));
  }
}

// A C identifier, or <DNS subdomain>/<C identifier>. Its errors name the map, not the key.
void ValidateQualifiedName(const std::string& name, const std::string& field, Errors& errors) {
  const std::vector<std::string> parts = absl::StrSplit(name, '/');
  if (parts.size() == 1) {
    ValidateCIdentifier(parts[0], field, errors);
  } else if (parts.size() == 2) {
    if (parts[0].empty()) {
      errors.push_back(Invalid(field, "\"\"", "the domain must not be empty"));
    } else {
      ValidateDriverName(parts[0], field, errors);
    }
    if (parts[1].empty()) {
      errors.push_back(Invalid(field, "\"\"", "the name must not be empty"));
    } else {
      ValidateCIdentifier(parts[1], field, errors);
    }
  } else {
    errors.push_back(Invalid(field, Quote(name), "must not contain more than one slash"));
  }
}

// A map key in a field path, cut in the middle when long (truncateIfTooLong).
// A canonical quantity's value as a number, for comparing two (Quantity.Cmp); nullopt where it
// is not one. Exact for what slices carry (integers of a binary or decimal suffix).
std::optional<long double> QuantityNumber(const std::string& text) {
  std::string canonical, error;
  if (text.empty() || !CanonicalQuantity(text, canonical, error)) return std::nullopt;
  static const std::pair<const char*, long double> kSuffixes[] = {
      {"Ki", 1024.0L}, {"Mi", 1048576.0L}, {"Gi", 1073741824.0L}, {"Ti", 1099511627776.0L},
      {"Pi", 1125899906842624.0L}, {"Ei", 1152921504606846976.0L}, {"n", 1e-9L}, {"u", 1e-6L},
      {"m", 1e-3L}, {"k", 1e3L}, {"M", 1e6L}, {"G", 1e9L}, {"T", 1e12L}, {"P", 1e15L}, {"E", 1e18L}};
  long double scale = 1;
  std::string number = canonical;
  for (const auto& [suffix, factor] : kSuffixes) {
    if (absl::EndsWith(number, suffix) && number.size() > strlen(suffix)) {
      number.resize(number.size() - strlen(suffix));
      scale = factor;
      break;
    }
  }
  if (const size_t e = number.find_first_of("eE"); e != std::string::npos) {
    int exponent = 0;
    if (!absl::SimpleAtoi(number.substr(e + 1), &exponent)) return std::nullopt;
    scale = std::pow(10.0L, exponent);
    number.resize(e);
  }
  double mantissa = 0;
  if (!absl::SimpleAtod(number, &mantissa)) return std::nullopt;
  return static_cast<long double>(mantissa) * scale;
}

// validateRequestPolicy, validateRequestPolicyValidValues and validateRequestPolicyRange
// (pkg/apis/resource/validation/validation.go, 1.36) for a capacity `value` of a device with
// allowMultipleAllocations. Quantities that do not parse are the decoder's error, not these.
void ValidateRequestPolicy(const std::string& value, const json& policy, const std::string& field,
                           Errors& errors) {
  const json values = policy.value("validValues", json::array());
  const bool has_values = values.is_array() && !values.empty();
  const bool has_range = policy.contains("validRange") && policy["validRange"].is_object();
  const std::optional<long double> capacity = QuantityNumber(value);
  const std::string default_text = StringAt(policy, "default");
  const std::optional<long double> default_value = QuantityNumber(default_text);
  auto canonical = [](const std::string& text) {
    std::string out, error;
    CanonicalQuantity(text, out, error);
    return out;
  };
  if (has_values && has_range) {
    errors.push_back(Forbidden(field, "exactly one policy can be specified, cannot specify "
                                      "\"validValues\" and \"validRange\" at the same time"));
    return;
  }
  if (has_values) {
    if (!policy.contains("default")) {
      errors.push_back(Required(field + ".default", "required when validValues is defined"));
      return;
    }
    const std::string at = field + ".validValues";
    for (size_t i = 0; i + 1 < values.size(); i++) {
      const auto a = QuantityNumber(values[i].is_string() ? values[i].get<std::string>() : "");
      const auto b = QuantityNumber(values[i + 1].is_string() ? values[i + 1].get<std::string>() : "");
      if (a && b && *a > *b) {
        errors.push_back(Invalid(absl::StrCat(at, "[", i + 1, "]"), canonical(values[i + 1].get<std::string>()),
                                 "values must be sorted in ascending order"));
      }
    }
    constexpr size_t kMaxOptions = 10;  // CapacityRequestPolicyDiscreteMaxOptions
    if (values.size() > kMaxOptions) {
      errors.push_back(TooMany(at, values.size(), kMaxOptions));
    }
    bool found_default = false;
    for (size_t i = 0; i < values.size(); i++) {
      const std::string option = values[i].is_string() ? values[i].get<std::string>() : "";
      const auto number = QuantityNumber(option);
      if (number && capacity && *number > *capacity) {
        errors.push_back(Invalid(absl::StrCat(at, "[", i, "]"), canonical(option),
                                 "option is larger than capacity value: " + canonical(value)));
      }
      found_default = found_default || (number && default_value && *number == *default_value);
    }
    if (!found_default) {
      errors.push_back(Invalid(at, canonical(default_text),
                               "default value is not valid according to the requestPolicy"));
    }
    return;
  }
  if (!has_range) return;
  if (!policy.contains("default")) {
    errors.push_back(Required(field + ".default", "required when validRange is defined"));
    return;
  }
  const json& range = policy["validRange"];
  const std::string at = field + ".validRange";
  if (!range.contains("min")) {
    errors.push_back(Required(at + ".min", "required when validRange is defined"));
    return;
  }
  const std::string min_text = StringAt(range, "min");
  const auto min = QuantityNumber(min_text);
  if (min && capacity && *min > *capacity) {
    errors.push_back(Invalid(at + ".min", canonical(min_text),
                             "min is larger than capacity value: " + canonical(value)));
  }
  if (min && default_value && *default_value < *min) {
    errors.push_back(Invalid(at + ".min", canonical(default_text),
                             "default is less than min: " + canonical(min_text)));
  }
  if (range.contains("max")) {
    const std::string max_text = StringAt(range, "max");
    const auto max = QuantityNumber(max_text);
    if (min && max && *min > *max) {
      errors.push_back(Invalid(at + ".max", canonical(min_text), "min is larger than max: " + canonical(max_text)));
    }
    if (max && capacity && *max > *capacity) {
      errors.push_back(Invalid(at + ".max", canonical(max_text),
                               "max is larger than capacity value: " + canonical(value)));
    }
    if (max && default_value && *default_value > *max) {
      errors.push_back(Invalid(at + ".max", canonical(default_text),
                               "default is more than max: " + canonical(max_text)));
    }
  }
  // validRange.step is not checked here: nothing of ours sets one.
}

std::string Key(const std::string& field, const std::string& key, size_t max) {
  max = std::max<size_t>(max, 16);
  if (key.size() <= max) return field + "[" + key + "]";
  const size_t remaining = max - 3;
  return field + "[" + key.substr(0, (remaining + 1) / 2) + "..." +
         key.substr(key.size() - remaining / 2) + "]";
}

void ValidateAttribute(const json& attribute, const std::string& field, Errors& errors) {
  int set = 0;
  if (attribute.contains("bool")) set++;
  if (attribute.contains("int")) set++;
  if (attribute.contains("string")) {
    set++;
    if (attribute["string"].get<std::string>().size() > kMaxAttributeValueLength) {
      errors.push_back(TooLong(field + ".string", kMaxAttributeValueLength));
    }
  }
  if (attribute.contains("version")) {
    set++;
    const std::string version = attribute["version"];
    if (!IsSemver(version)) {
      errors.push_back(Invalid(field + ".version", Quote(version),
                               "must be a string compatible with semver.org spec 2.0.0"));
    }
    if (version.size() > kMaxAttributeValueLength) {
      errors.push_back(TooLong(field + ".version", kMaxAttributeValueLength));
    }
  }
  if (set == 0) errors.push_back(Invalid(field, "\"\"", "exactly one value must be specified"));
  if (set > 1) {
    errors.push_back(Invalid(field, attribute.dump(), "exactly one value must be specified"));
  }
}

const json* FindDevice(const json* spec, const std::string& name) {
  if (spec == nullptr || !spec->contains("devices")) return nullptr;
  for (const json& device : (*spec)["devices"]) {
    if (StringAt(device, "name") == name) return &device;
  }
  return nullptr;
}

void ValidateDevice(const json& device, const json* old_device, const std::string& field,
                    bool per_device_node_selection, Errors& errors) {
  const std::string name = StringAt(device, "name");
  for (const std::string& message : IsDNS1123Label(name)) {
    errors.push_back(Invalid(field + ".name", Quote(name), message));
  }
  const json attributes = device.value("attributes", json::object());
  const json capacity = device.value("capacity", json::object());
  const size_t entries = attributes.size() + capacity.size();
  if (entries > kMaxAttributesAndCapacities) {
    errors.push_back(Invalid(field, std::to_string(entries),
                             absl::StrCat("the total number of attributes and capacities must "
                                          "not exceed ",
                                          kMaxAttributesAndCapacities)));
  }
  // nlohmann's objects iterate by key: the errors come in a stable order (Go's maps do not).
  for (const auto& [key, attribute] : attributes.items()) {
    ValidateQualifiedName(key, field + ".attributes", errors);
    ValidateAttribute(attribute, Key(field + ".attributes", key, kQualifiedNameKeyLength), errors);
  }
  if (old_device == nullptr || old_device->value("capacity", json::object()) != capacity) {
    const bool multiple = device.value("allowMultipleAllocations", false);
    for (const auto& [key, value] : capacity.items()) {
      ValidateQualifiedName(key, field + ".capacity", errors);
      const std::string policy_field =
          Key(field + ".capacity", key, kQualifiedNameKeyLength) + ".requestPolicy";
      if (!multiple && value.contains("requestPolicy")) {
        errors.push_back(Forbidden(policy_field, "allowMultipleAllocations must be true"));
      } else if (value.contains("requestPolicy") && value["requestPolicy"].is_object()) {
        ValidateRequestPolicy(StringAt(value, "value"), value["requestPolicy"], policy_field, errors);
      }
    }
  }
  // validateDevice: taints are validated when they changed (validateDeviceTaint).
  const json taints = device.value("taints", json::array());
  if (taints.is_array() && (old_device == nullptr || old_device->value("taints", json::array()) != taints)) {
    if (taints.size() > kMaxTaints) {
      errors.push_back(TooMany(field + ".taints", taints.size(), kMaxTaints));
    } else {
      for (size_t i = 0; i < taints.size(); i++) {
        const std::string at = absl::StrCat(field, ".taints[", i, "]");
        const std::string key = StringAt(taints[i], "key");
        const std::string value = StringAt(taints[i], "value");
        const std::string effect = StringAt(taints[i], "effect");
        if (key.empty()) {
          errors.push_back(Required(at + ".key"));
        } else {
          for (const std::string& message : IsQualifiedName(key)) {
            errors.push_back(Invalid(at + ".key", Quote(key), message));
          }
        }
        for (const std::string& message : IsLabelValue(value)) {
          errors.push_back(Invalid(at + ".value", Quote(value), message));
        }
        if (effect.empty()) {
          errors.push_back(Required(at + ".effect"));
        } else if (effect != "NoExecute" && effect != "NoSchedule" && effect != "None") {
          errors.push_back({"FieldValueNotSupported", at + ".effect",
                            absl::StrCat("Unsupported value: ", Quote(effect),
                                         ": supported values: \"NoExecute\", \"NoSchedule\", "
                                         "\"None\"")});
        }
      }
    }
  }
  const bool node_name = device.contains("nodeName");
  const bool node_selector = device.contains("nodeSelector");
  const bool all_nodes = device.contains("allNodes");
  if (per_device_node_selection) {
    std::vector<std::string> set;
    if (node_name) {
      if (device["nodeName"] == "") {
        errors.push_back(Invalid(field + ".nodeName", "\"\"", "must not be empty"));
      } else {
        set.push_back("`nodeName`");
        ValidateNodeName(device["nodeName"].get<std::string>(), field + ".nodeName", errors);
      }
    }
    if (node_selector) set.push_back("`nodeSelector`");
    if (all_nodes) {
      if (device["allNodes"] == true) {
        set.push_back("`allNodes`");
      } else {
        errors.push_back(
            Invalid(field + ".allNodes", "false", "must be either unset or set to true"));
      }
    }
    constexpr char kOne[] =
        "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when "
        "`perDeviceNodeSelection` is set to true in the ResourceSlice spec";
    if (set.empty()) errors.push_back(Required(field, kOne));
    if (set.size() > 1) {
      errors.push_back(Invalid(field, Quote("{" + absl::StrJoin(set, ", ") + "}"), kOne));
    }
  } else if (node_name || node_selector || all_nodes) {
    errors.push_back(Invalid(field, "null",
                             "`nodeName`, `nodeSelector` and `allNodes` can only be set if "
                             "`perDeviceNodeSelection` is set to true in the ResourceSlice spec"));
  }
}

// ValidateImmutableField: a pointer's value printed, "null" when unset.
void Immutable(const json& spec, const json& old_spec, const std::vector<std::string>& where,
               const std::string& field, Errors& errors) {
  const json* now = &spec;
  const json* before = &old_spec;
  for (const std::string& step : where) {
    now = now != nullptr && now->contains(step) ? &(*now)[step] : nullptr;
    before = before != nullptr && before->contains(step) ? &(*before)[step] : nullptr;
  }
  const json empty = where.back() == "nodeName" ? json(nullptr) : json("");
  const json& a = now != nullptr ? *now : empty;
  const json& b = before != nullptr ? *before : empty;
  if (a != b) errors.push_back(Invalid(field, a.dump(), "field is immutable"));
}

void ValidateSpec(const json& spec, const json* old_spec, Errors& errors) {
  ValidateDriverName(StringAt(spec, "driver"), "spec.driver", errors);
  const json pool = spec.value("pool", json::object());
  ValidatePoolName(StringAt(pool, "name"), "spec.pool.name", errors);
  const int64_t slice_count = IntAt(pool, "resourceSliceCount");
  if (slice_count <= 0) {
    errors.push_back(Invalid("spec.pool.resourceSliceCount", std::to_string(slice_count),
                             "must be greater than zero"));
  }
  const int64_t generation = IntAt(pool, "generation");
  if (generation < 0) {
    errors.push_back(Invalid("spec.pool.generation", std::to_string(generation),
                             "must be greater than or equal to zero"));
  }
  if (old_spec != nullptr) {
    Immutable(spec, *old_spec, {"pool", "name"}, "spec.pool.name", errors);
    Immutable(spec, *old_spec, {"driver"}, "spec.driver", errors);
    Immutable(spec, *old_spec, {"nodeName"}, "spec.nodeName", errors);
  }
  std::vector<std::string> set;
  if (spec.contains("nodeName")) {
    const std::string node = spec["nodeName"];
    if (node.empty()) {
      errors.push_back(Invalid("spec.nodeName", "\"\"",
                               "must be either unset or set to a non-empty string"));
    } else {
      set.push_back("`nodeName`");
      ValidateNodeName(node, "spec.nodeName", errors);
    }
  }
  if (spec.contains("nodeSelector")) {
    set.push_back("`nodeSelector`");
    const json& selector = spec["nodeSelector"];
    const json terms = selector.is_object() ? selector.value("nodeSelectorTerms", json::array())
                                            : json::array();
    if (!terms.is_array() || terms.size() != 1) {
      errors.push_back(Invalid("spec.nodeSelector.nodeSelectorTerms", terms.dump(),
                               "must have exactly one node selector term"));
    }
  }
  for (const char* flag : {"allNodes", "perDeviceNodeSelection"}) {
    if (!spec.contains(flag)) continue;
    if (spec[flag] == true) {
      set.push_back(absl::StrCat("`", flag, "`"));
    } else {
      errors.push_back(Invalid(absl::StrCat("spec.", flag), "false",
                               "must be either unset or set to true"));
    }
  }
  constexpr char kOne[] =
      "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is "
      "required";
  if (set.empty()) errors.push_back(Required("spec", kOne));
  if (set.size() > 1) {
    errors.push_back(Invalid("spec", Quote("{" + absl::StrJoin(set, ", ") + "}"),
                             absl::StrCat(kOne, ", but multiple fields are set")));
  }
  if (spec.contains("sharedCounters") && spec.contains("devices")) {
    errors.push_back(
        Invalid("spec", "\"\"", "only one of `sharedCounters` or `devices` is allowed"));
  }
  const json devices = spec.value("devices", json::array());
  int max = kMaxDevices;
  for (const json& device : devices) {
    for (const char* advanced : {"taints", "consumesCounters"}) {
      if (device.contains(advanced) && device[advanced].is_array() && !device[advanced].empty()) {
        max = kMaxDevicesWithTaintsOrCounters;
      }
    }
  }
  if (devices.size() > static_cast<size_t>(max)) {
    errors.push_back(TooMany("spec.devices", devices.size(), max));  // and nothing else
    return;
  }
  const bool per_device = spec.value("perDeviceNodeSelection", false);
  std::set<std::string> names;
  for (size_t i = 0; i < devices.size(); i++) {
    const std::string name = StringAt(devices[i], "name");
    ValidateDevice(devices[i], FindDevice(old_spec, name), absl::StrCat("spec.devices[", i, "]"),
                   per_device, errors);
  }
  for (size_t i = 0; i < devices.size(); i++) {
    const std::string name = StringAt(devices[i], "name");
    if (!names.insert(name).second) {
      errors.push_back(Duplicate(absl::StrCat("spec.devices[", i, "]"), Quote(name)));
    }
  }
}

void ValidateOwnerReferences(const json& metadata, Errors& errors) {
  const std::string field = "metadata.ownerReferences";
  const json owners = metadata.value("ownerReferences", json::array());
  std::string controller;
  for (const json& owner : owners) {
    const std::string api_version = StringAt(owner, "apiVersion");
    const std::string version = api_version.substr(api_version.rfind('/') + 1);
    if (version.empty()) {
      errors.push_back(
          Invalid(field + ".apiVersion", Quote(api_version), "version must not be empty"));
    }
    for (const char* part : {"kind", "name", "uid"}) {
      if (StringAt(owner, part).empty()) {
        errors.push_back(Invalid(absl::StrCat(field, ".", part), "\"\"", "must not be empty"));
      }
    }
    if (owner.value("controller", false)) {
      const std::string name = StringAt(owner, "kind") + "/" + StringAt(owner, "name");
      if (controller.empty()) {
        controller = name;
      } else {
        errors.push_back(Invalid(field, owners.dump(),
                                 absl::StrCat("Only one reference can have Controller set to "
                                              "true. Found \"true\" in references for ",
                                              controller, " and ", name)));
      }
    }
  }
}

// ValidateObjectMeta of a cluster-scoped object named as a DNS subdomain.
void ValidateMetadata(const json& metadata, Errors& errors) {
  const std::string generate_name = StringAt(metadata, "generateName");
  if (!generate_name.empty()) {
    std::string masked = generate_name;  // maskTrailingDash
    if (masked.size() > 1 && masked.back() == '-') {
      masked = masked.substr(0, masked.size() - 2) + "a";
    }
    for (const std::string& message : IsDNS1123Subdomain(masked)) {
      errors.push_back(Invalid("metadata.generateName", Quote(generate_name), message));
    }
  }
  const std::string name = StringAt(metadata, "name");
  if (name.empty()) {
    errors.push_back(Required("metadata.name", "name or generateName is required"));
  } else {
    for (const std::string& message : IsDNS1123Subdomain(name)) {
      errors.push_back(Invalid("metadata.name", Quote(name), message));
    }
  }
  ValidateOwnerReferences(metadata, errors);
}

// 422 Invalid (errors.NewInvalid): the message aggregates the distinct errors.
void AnswerInvalid(httplib::Response& res, const std::string& name, const Errors& errors) {
  std::vector<std::string> messages;
  std::set<std::string> seen;
  json causes = json::array();
  for (const FieldError& error : errors) {
    const std::string message = error.field + ": " + error.body;
    if (seen.insert(message).second) messages.push_back(message);
    causes.push_back({{"reason", error.type}, {"message", error.body}, {"field", error.field}});
  }
  const std::string aggregate =
      messages.size() == 1 ? messages[0] : "[" + absl::StrJoin(messages, ", ") + "]";
  json details = {{"name", name}, {"group", kGroup}, {"kind", "ResourceSlice"}, {"causes", causes}};
  Answer(res, 422, "Invalid",
         absl::StrCat("ResourceSlice.", kGroup, " ", Quote(name), " is invalid: ", aggregate),
         details);
}

// ---------------------------------------------------------------------------------------------
// Field selectors (apimachinery/pkg/fields/selector.go: ParseSelector) on ResourceSlices' fields.

struct Requirement {
  std::string field;
  bool equal;
  std::string value;
};

// Parses `text` and checks its fields. False with the 400 answered.
bool ParseFieldSelector(const std::string& text, std::vector<Requirement>& out,
                        httplib::Response& res) {
  // Terms split at commas no backslash escapes.
  std::vector<std::string> terms(1);
  for (size_t i = 0; i < text.size(); i++) {
    if (text[i] == '\\' && i + 1 < text.size()) {
      terms.back() += text.substr(i, 2);
      i++;
    } else if (text[i] == ',') {
      terms.emplace_back();
    } else {
      terms.back() += text[i];
    }
  }
  for (const std::string& term : terms) {
    if (term.empty()) continue;
    size_t at = std::string::npos, length = 0;
    for (size_t i = 0; i < term.size() && at == std::string::npos; i++) {
      for (const char* op : {"!=", "==", "="}) {
        if (term.compare(i, strlen(op), op) == 0) {
          at = i;
          length = strlen(op);
          break;
        }
      }
    }
    if (at == std::string::npos) {
      Answer(res, 400, "BadRequest",
             absl::StrCat("invalid selector: '", text, "'; can't understand '", term, "'"));
      return false;
    }
    Requirement requirement{term.substr(0, at), term.compare(at, 2, "!=") != 0, ""};
    const std::string escaped = term.substr(at + length);
    for (size_t i = 0; i < escaped.size(); i++) {
      if (escaped[i] != '\\') {
        requirement.value += escaped[i];
      } else if (i + 1 < escaped.size() && strchr("\\,=", escaped[i + 1]) != nullptr) {
        requirement.value += escaped[++i];
      } else {
        Answer(res, 400, "BadRequest",
               absl::StrCat("invalid field selector: invalid escape sequence: ", escaped));
        return false;
      }
    }
    if (requirement.field != "metadata.name" && requirement.field != "spec.driver" &&
        requirement.field != "spec.nodeName") {
      Answer(res, 400, "BadRequest",
             absl::StrCat("field label not supported for ", kApiVersion,
                          ", Kind=ResourceSlice: ", requirement.field));
      return false;
    }
    out.push_back(std::move(requirement));
  }
  return true;
}

bool Selected(const json& slice, const std::vector<Requirement>& selector) {
  for (const Requirement& requirement : selector) {
    std::string value;
    if (requirement.field == "metadata.name") value = Meta(slice, "name");
    if (requirement.field == "spec.driver") value = StringAt(slice["spec"], "driver");
    if (requirement.field == "spec.nodeName") value = StringAt(slice["spec"], "nodeName");
    if ((value == requirement.value) != requirement.equal) return false;
  }
  return true;
}

// DeleteOptions from a DELETE's body, when it has one. False with the error answered.
bool DeleteOptions(const httplib::Request& req, json& options, httplib::Response& res) {
  options = json::object();
  if (req.body.empty()) return true;
  const std::string type = MediaType(req);
  if (type != "application/json" && type != "application/yaml") {
    RefuseMediaType(res);
    return false;
  }
  options = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (options.is_discarded() || !options.is_object()) {
    Answer(res, 400, "BadRequest", "the request body is not a DeleteOptions object");
    return false;
  }
  if (options.contains("kind") && options["kind"] != "DeleteOptions") {
    Answer(res, 400, "BadRequest",
           absl::StrCat("decoded object of kind ", options["kind"].dump(),
                        " cannot be converted to DeleteOptions"));
    return false;
  }
  return true;
}

// The preconditions of `options` against `stored`: false with the 409 answered.
bool PreconditionsHold(const json& options, const json& stored, const std::string& name,
                       httplib::Response& res) {
  const json preconditions = options.value("preconditions", json::object());
  if (!preconditions.is_object()) return true;
  for (const auto& [field, what] : {std::pair<const char*, const char*>{"uid", "UID"},
                                    {"resourceVersion", "ResourceVersion"}}) {
    if (!preconditions.contains(field) || !preconditions[field].is_string()) continue;
    const std::string wanted = preconditions[field];
    const std::string actual = Meta(stored, field);
    if (wanted != actual) {
      Conflict(res, name, PreconditionFailed(name, what, wanted, actual));
      return false;
    }
  }
  return true;
}

json SliceList(const std::vector<json>& items, uint64_t revision) {
  json list = {{"kind", "ResourceSliceList"},
               {"apiVersion", kApiVersion},
               {"metadata", {{"resourceVersion", std::to_string(revision)}}},
               {"items", json::array()}};
  for (const json& item : items) list["items"].push_back(ListItem(item));
  return list;
}

// Query parameters this stand-in does not implement: 501, said so. False when answered.
bool Unimplemented(const httplib::Request& req, httplib::Response& res) {
  for (const char* parameter : {"watch", "labelSelector", "dryRun"}) {
    const std::string value = Query(req, parameter);
    if (!value.empty() && value != "false" && value != "0") {
      Answer(res, 501, "NotImplemented",
             absl::StrCat("the test API server does not implement ", parameter,
                          " on resourceslices"));
      return false;
    }
  }
  return true;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

void TestApiServer::ServeResources() {
  node_uid_ = NewUid();
  {
    absl::MutexLock lock(&mu_);
    node_["metadata"]["uid"] = node_uid_;
  }
  // What the real server answers for a path it does not serve (another version, another
  // resource): 404 with a Status, not an empty body.
  const httplib::Server::HandlerWithResponse unserved = [](const httplib::Request&,
                                                           httplib::Response& res) {
    if (!res.body.empty() || res.status != 404) return httplib::Server::HandlerResponse::Unhandled;
    Answer(res, 404, "NotFound", "the server could not find the requested resource",
           json::object());
    return httplib::Server::HandlerResponse::Handled;
  };
  server_->set_error_handler(unserved);
  ServeResourceClaims();
  ServeResourceSlices();
}

void TestApiServer::ServeResourceClaims() {
  server_->Get(kClaimPattern, [this](const httplib::Request& req, httplib::Response& res) {
    absl::MutexLock lock(&mu_);
    claim_gets_++;
    if (claim_fail_left_ > 0) {
      claim_fail_left_--;
      return AnswerInjected(res, claim_fail_status_);
    }
    const std::string ns = req.matches[1], name = req.matches[2];
    auto it = claims_.find(ns + "/" + name);
    if (it == claims_.end()) return NotFound(res, "resourceclaims", name);
    res.set_content(it->second.dump(), "application/json");
  });
}

void TestApiServer::ServeResourceSlices() {
  // LIST, with a field selector; or WATCH.
  server_->Get(kSlicesPattern, [this](const httplib::Request& req, httplib::Response& res) {
    absl::MutexLock lock(&mu_);
    const std::string watch = Query(req, "watch");
    if (watch == "true" || watch == "1") {
      slice_watches_++;
      if (InjectedSliceFailure(res)) return;
      return WatchSlices(req, res);
    }
    slice_lists_++;
    if (InjectedSliceFailure(res) || !Unimplemented(req, res)) return;
    std::vector<Requirement> selector;
    if (!ParseFieldSelector(Query(req, "fieldSelector"), selector, res)) return;
    std::vector<json> items;
    for (const auto& [name, slice] : slices_) {
      if (Selected(slice, selector)) items.push_back(slice);
    }
    res.set_content(SliceList(items, revision_).dump(), "application/json");
  });
  server_->Get(kSlicePattern, [this](const httplib::Request& req, httplib::Response& res) {
    absl::MutexLock lock(&mu_);
    if (InjectedSliceFailure(res) || !Unimplemented(req, res)) return;
    const std::string name = req.matches[1];
    auto it = slices_.find(name);
    if (it == slices_.end()) return NotFound(res, "resourceslices", name);
    res.set_content(it->second.dump(), "application/json");
  });
  // CREATE.
  server_->Post(kSlicesPattern, [this](const httplib::Request& req, httplib::Response& res) {
    absl::MutexLock lock(&mu_);
    if (InjectedSliceFailure(res) || !Unimplemented(req, res)) return;
    std::string directive;
    if (!FieldValidation(req, "CreateOptions", directive, res)) return;
    if (MediaType(req) != "application/json") return RefuseMediaType(res);
    json slice;
    if (!DecodeSlice(req, directive, slice, res)) return;
    // rest.BeforeCreate: no namespace, a generated name, the system fields, PrepareForCreate.
    json& metadata = slice["metadata"];
    metadata.erase("namespace");
    metadata.erase("selfLink");
    if (StringAt(metadata, "name").empty() && !StringAt(metadata, "generateName").empty()) {
      metadata["name"] = GenerateSliceName(metadata["generateName"]);
    }
    metadata["uid"] = NewUid();
    metadata["creationTimestamp"] = Now();
    metadata["generation"] = 1;
    const std::string name = StringAt(metadata, "name");
    PrepareTaints(slice["spec"], nullptr);
    Errors errors;
    ValidateMetadata(metadata, errors);
    ValidateSpec(slice["spec"], nullptr, errors);
    if (!errors.empty()) return AnswerInvalid(res, name, errors);
    // etcd3's store: a create must not carry a resourceVersion; the name must be free.
    if (!StringAt(metadata, "resourceVersion").empty()) {
      return Answer(res, 500, "", "resourceVersion should not be set on objects to be created");
    }
    if (slices_.count(name) != 0) {
      return Answer(res, 409, "AlreadyExists",
                    absl::StrCat("resourceslices.", kGroup, " ", Quote(name), " already exists"),
                    Details(name, "resourceslices"));
    }
    const json stored = StoreSlice(std::move(slice));
    slice_writes_++;
    res.status = 201;
    res.set_content(stored.dump(), "application/json");
  });
  // UPDATE.
  server_->Put(kSlicePattern, [this](const httplib::Request& req, httplib::Response& res) {
    absl::MutexLock lock(&mu_);
    if (InjectedSliceFailure(res) || !Unimplemented(req, res)) return;
    std::string directive;
    if (!FieldValidation(req, "UpdateOptions", directive, res)) return;
    if (MediaType(req) != "application/json") return RefuseMediaType(res);
    json slice;
    if (!DecodeSlice(req, directive, slice, res)) return;
    const std::string name = req.matches[1];
    json& metadata = slice["metadata"];
    if (StringAt(metadata, "name") != name) {
      return Answer(res, 400, "BadRequest",
                    absl::StrCat("the name of the object (", StringAt(metadata, "name"),
                                 ") does not match the name on the URL (", name, ")"));
    }
    auto it = slices_.find(name);
    if (it == slices_.end()) return NotFound(res, "resourceslices", name);
    json& stored = it->second;
    // GuaranteedUpdate: the object's uid is a precondition; then the optimistic lock.
    const std::string uid = StringAt(metadata, "uid");
    if (!uid.empty() && uid != Meta(stored, "uid")) {
      return Conflict(res, name, PreconditionFailed(name, "UID", uid, Meta(stored, "uid")));
    }
    if (slice_conflicts_left_ > 0) {
      // Another writer got there first: its write moved the resourceVersion on.
      slice_conflicts_left_--;
      stored["metadata"]["resourceVersion"] = std::to_string(++revision_);
      SliceChanged("MODIFIED", stored);
      return Conflict(res, name, kModified);
    }
    const std::string version = StringAt(metadata, "resourceVersion");
    if (!version.empty() && version != Meta(stored, "resourceVersion")) {
      return Conflict(res, name, kModified);
    }
    // rest.BeforeUpdate and PrepareForUpdate: what the server owns comes from the stored object;
    // a change of spec is a new generation.
    metadata.erase("namespace");
    metadata.erase("selfLink");
    metadata["uid"] = stored["metadata"]["uid"];
    metadata["creationTimestamp"] = stored["metadata"]["creationTimestamp"];
    metadata["generation"] = stored["metadata"].value("generation", 1);
    PrepareTaints(slice["spec"], &stored["spec"]);
    if (slice["spec"] != stored["spec"]) {
      metadata["generation"] = metadata["generation"].get<int64_t>() + 1;
    }
    Errors errors;
    ValidateOwnerReferences(metadata, errors);
    ValidateSpec(slice["spec"], &stored["spec"], errors);
    if (!errors.empty()) return AnswerInvalid(res, name, errors);
    metadata["resourceVersion"] = stored["metadata"]["resourceVersion"];
    slice["kind"] = "ResourceSlice";
    slice["apiVersion"] = kApiVersion;
    slice_writes_++;
    if (slice == stored) {  // nothing changed: nothing is written (etcd3 store, GuaranteedUpdate)
      res.set_content(stored.dump(), "application/json");
      return;
    }
    const json written = StoreSlice(std::move(slice));
    res.set_content(written.dump(), "application/json");
  });
  server_->Patch(kSlicePattern, [](const httplib::Request&, httplib::Response& res) {
    Answer(res, 501, "NotImplemented",
           "the test API server does not implement PATCH of resourceslices");
  });
  // DELETE, with preconditions.
  server_->Delete(kSlicePattern, [this](const httplib::Request& req, httplib::Response& res) {
    absl::MutexLock lock(&mu_);
    if (InjectedSliceFailure(res) || !Unimplemented(req, res)) return;
    json options;
    if (!DeleteOptions(req, options, res)) return;
    const std::string name = req.matches[1];
    auto it = slices_.find(name);
    if (it == slices_.end()) return NotFound(res, "resourceslices", name);
    if (!PreconditionsHold(options, it->second, name, res)) return;
    const json deleted = it->second;
    slices_.erase(it);
    revision_++;
    SliceChanged("DELETED", deleted);
    slice_writes_++;
    res.set_content(deleted.dump(), "application/json");
  });
  // DELETE of the collection, by field selector: what the kubelet does at its start.
  server_->Delete(kSlicesPattern, [this](const httplib::Request& req, httplib::Response& res) {
    absl::MutexLock lock(&mu_);
    if (InjectedSliceFailure(res) || !Unimplemented(req, res)) return;
    json options;
    if (!DeleteOptions(req, options, res)) return;
    std::vector<Requirement> selector;
    if (!ParseFieldSelector(Query(req, "fieldSelector"), selector, res)) return;
    std::vector<json> deleted;
    for (auto it = slices_.begin(); it != slices_.end();) {
      if (Selected(it->second, selector)) {
        deleted.push_back(it->second);
        it = slices_.erase(it);
        revision_++;
        SliceChanged("DELETED", deleted.back());
      } else {
        ++it;
      }
    }
    slice_writes_++;
    res.set_content(SliceList(deleted, revision_).dump(), "application/json");
  });
}

bool TestApiServer::InjectedSliceFailure(httplib::Response& res) {
  if (slice_fail_left_ <= 0) return false;
  slice_fail_left_--;
  AnswerInjected(res, slice_fail_status_);
  return true;
}

void TestApiServer::DisableDeviceTaints() {
  absl::MutexLock lock(&mu_);
  device_taints_ = false;
}

void TestApiServer::EnableDeviceTaints() {
  absl::MutexLock lock(&mu_);
  device_taints_ = true;
}

void TestApiServer::PrepareTaints(nlohmann::json& spec, const nlohmann::json* old_spec) {
  if (!spec.contains("devices") || !spec["devices"].is_array()) return;
  bool in_use = false;  // draDeviceTaintsFeatureInUse(oldSlice)
  if (old_spec != nullptr && old_spec->contains("devices") && (*old_spec)["devices"].is_array()) {
    for (const json& device : (*old_spec)["devices"]) {
      in_use = in_use || (device.contains("taints") && !device["taints"].empty());
    }
  }
  for (json& device : spec["devices"]) {
    if (!device.is_object() || !device.contains("taints")) continue;
    if (!device_taints_ && !in_use) {
      device.erase("taints");  // dropped, no error, no warning
      continue;
    }
    if (!device["taints"].is_array()) continue;
    for (json& taint : device["taints"]) {
      if (taint.is_object() && !taint.contains("timeAdded")) taint["timeAdded"] = Now();
    }
  }
}

nlohmann::json TestApiServer::StoreSlice(nlohmann::json slice) {
  slice["kind"] = "ResourceSlice";
  slice["apiVersion"] = kApiVersion;
  slice["metadata"]["resourceVersion"] = std::to_string(++revision_);
  const std::string name = Meta(slice, "name");
  SliceChanged(slices_.count(name) != 0 ? "MODIFIED" : "ADDED", slice);
  slices_[name] = slice;
  // The garbage collector deletes a dependent whose owners are all gone; of owners only the
  // Node is known here, and it exists under its name with node_uid_.
  const json owners = slice["metadata"].value("ownerReferences", json::array());
  const bool orphan =
      !owners.empty() && std::all_of(owners.begin(), owners.end(), [&](const json& owner) {
        return StringAt(owner, "apiVersion") == "v1" && StringAt(owner, "kind") == "Node" &&
               (StringAt(owner, "name") != node_name_ || StringAt(owner, "uid") != node_uid_);
      });
  if (orphan) {
    slices_.erase(name);
    revision_++;
    SliceChanged("DELETED", slice);
    slices_collected_++;
  }
  return slice;
}

std::string TestApiServer::GenerateSliceName(const std::string& base) {
  // names.SimpleNameGenerator with utilrand's alphabet (no vowels, no 0, 1, 3).
  static constexpr char kAlphabet[] = "bcdfghjklmnpqrstvwxz2456789";
  thread_local std::mt19937 random(std::random_device{}());
  std::uniform_int_distribution<size_t> pick(0, sizeof kAlphabet - 2);
  const std::string prefix = base.substr(0, 58);
  std::string name;
  do {
    name = prefix;
    for (int i = 0; i < 5; i++) name += kAlphabet[pick(random)];
  } while (slices_.count(name) != 0);
  return name;
}

nlohmann::json TestApiServer::MakeAllocatedClaim(
    const std::string& ns, const std::string& name, const std::string& driver,
    const std::string& pool, const std::vector<std::pair<std::string, std::string>>& results) {
  json requests = json::array(), allocated = json::array();
  std::set<std::string> request_names;
  for (const auto& [request, device] : results) {
    const std::string top = request.substr(0, request.find('/'));  // "main/sub": "main"
    if (request_names.insert(top).second) {
      json exactly = {{"deviceClassName", driver}, {"allocationMode", "ExactCount"}, {"count", 1}};
      requests.push_back({{"name", top}, {"exactly", exactly}});
    }
    allocated.push_back(
        {{"request", request}, {"driver", driver}, {"pool", pool}, {"device", device}});
  }
  // A node-local pool's allocation selects its node by name (the scheduler's allocator).
  json field = {{"key", "metadata.name"}, {"operator", "In"}, {"values", json::array({pool})}};
  json term = json::object();
  term["matchFields"] = json::array({field});
  json node_selector = json::object();
  node_selector["nodeSelectorTerms"] = json::array({term});
  json allocation = json::object();
  allocation["devices"] = {{"results", allocated}};
  allocation["nodeSelector"] = node_selector;
  json pod = {{"resource", "pods"}, {"name", name + "-pod"}, {"uid", NewUid()}};
  json claim = {{"apiVersion", kApiVersion}, {"kind", "ResourceClaim"}};
  claim["metadata"] = {{"name", name}, {"namespace", ns}};
  claim["spec"]["devices"]["requests"] = requests;
  claim["status"]["allocation"] = allocation;
  claim["status"]["reservedFor"] = json::array({pod});
  return claim;
}

nlohmann::json TestApiServer::AddResourceClaim(const nlohmann::json& claim) {
  const std::string ns = Meta(claim, "namespace"), name = Meta(claim, "name");
  if (ns.empty() || name.empty()) return nullptr;
  json stored = claim;
  stored["kind"] = "ResourceClaim";
  stored["apiVersion"] = kApiVersion;
  if (Meta(stored, "uid").empty()) stored["metadata"]["uid"] = NewUid();
  if (Meta(stored, "creationTimestamp").empty()) stored["metadata"]["creationTimestamp"] = Now();
  absl::MutexLock lock(&mu_);
  stored["metadata"]["resourceVersion"] = std::to_string(++revision_);
  claims_[ns + "/" + name] = stored;
  return stored;
}

bool TestApiServer::DeleteResourceClaim(const std::string& ns, const std::string& name) {
  absl::MutexLock lock(&mu_);
  if (claims_.erase(ns + "/" + name) == 0) return false;
  revision_++;
  return true;
}

nlohmann::json TestApiServer::ReplaceResourceClaim(const std::string& ns, const std::string& name) {
  json claim = ResourceClaim(ns, name);
  if (claim.is_null()) return nullptr;
  claim["metadata"].erase("uid");
  return ReplaceResourceClaim(claim);
}

nlohmann::json TestApiServer::ReplaceResourceClaim(const nlohmann::json& claim) {
  const std::string ns = Meta(claim, "namespace"), name = Meta(claim, "name");
  json replacement = claim;
  {
    absl::MutexLock lock(&mu_);
    auto it = claims_.find(ns + "/" + name);
    if (it == claims_.end()) return nullptr;
    if (Meta(replacement, "uid").empty() || Meta(replacement, "uid") == Meta(it->second, "uid")) {
      replacement["metadata"]["uid"] = NewUid();
    }
    claims_.erase(it);
    revision_++;  // the deletion
  }
  replacement["metadata"]["creationTimestamp"] = Now();
  return AddResourceClaim(replacement);
}

nlohmann::json TestApiServer::ResourceClaim(const std::string& ns, const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = claims_.find(ns + "/" + name);
  return it == claims_.end() ? json(nullptr) : it->second;
}

int TestApiServer::resource_claim_gets() {
  absl::MutexLock lock(&mu_);
  return claim_gets_;
}

void TestApiServer::FailNextClaimGets(int status, int n) {
  absl::MutexLock lock(&mu_);
  claim_fail_status_ = status;
  claim_fail_left_ = n;
}

std::vector<nlohmann::json> TestApiServer::ResourceSlices() {
  absl::MutexLock lock(&mu_);
  std::vector<json> out;
  for (const auto& [name, slice] : slices_) out.push_back(slice);
  return out;
}

bool TestApiServer::WaitForResourceSlices(
    const std::function<bool(const std::vector<nlohmann::json>&)>& predicate,
    absl::Duration timeout, std::vector<nlohmann::json>* slices) {
  std::vector<json> seen;
  auto holds = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    seen.clear();
    for (const auto& [name, slice] : slices_) seen.push_back(slice);
    return predicate(seen);
  };
  absl::MutexLock lock(&mu_);
  // The handlers change slices_ under mu_, which wakes this condition: no polling.
  const bool held = mu_.AwaitWithTimeout(absl::Condition(&holds), timeout);
  if (slices != nullptr) *slices = seen;
  return held;
}

nlohmann::json TestApiServer::AddResourceSlice(const nlohmann::json& slice) {
  json stored = slice;
  if (!stored.contains("metadata") || !stored["metadata"].is_object()) {
    stored["metadata"] = json::object();
  }
  json& metadata = stored["metadata"];
  absl::MutexLock lock(&mu_);
  if (StringAt(metadata, "name").empty()) {
    metadata["name"] = GenerateSliceName(StringAt(metadata, "generateName"));
  }
  if (StringAt(metadata, "uid").empty()) metadata["uid"] = NewUid();
  if (StringAt(metadata, "creationTimestamp").empty()) metadata["creationTimestamp"] = Now();
  if (!metadata.contains("generation")) metadata["generation"] = 1;
  return StoreSlice(std::move(stored));
}

int TestApiServer::DeleteAllResourceSlices(const std::string& node_name,
                                           const std::string& driver) {
  absl::MutexLock lock(&mu_);
  int deleted = 0;
  for (auto it = slices_.begin(); it != slices_.end();) {
    const json& spec = it->second["spec"];
    if (StringAt(spec, "nodeName") == node_name &&
        (driver.empty() || StringAt(spec, "driver") == driver)) {
      const json gone = it->second;
      it = slices_.erase(it);
      revision_++;
      SliceChanged("DELETED", gone);
      deleted++;
    } else {
      ++it;
    }
  }
  return deleted;
}

int TestApiServer::resource_slice_writes() {
  absl::MutexLock lock(&mu_);
  return slice_writes_;
}

int TestApiServer::resource_slices_collected() {
  absl::MutexLock lock(&mu_);
  return slices_collected_;
}

void TestApiServer::ConflictNextSliceUpdates(int n) {
  absl::MutexLock lock(&mu_);
  slice_conflicts_left_ = n;
}

void TestApiServer::FailNextSliceRequests(int status, int n) {
  absl::MutexLock lock(&mu_);
  slice_fail_status_ = status;
  slice_fail_left_ = n;
}

void TestApiServer::SliceChanged(const std::string& type, nlohmann::json object) {
  object["metadata"]["resourceVersion"] = std::to_string(revision_);
  slice_events_.push_back({revision_, type, std::move(object)});
}

void TestApiServer::WatchSlices(const httplib::Request& req, httplib::Response& res) {
  if (watch_refusal_ != 0) {
    // What RBAC answers a role without the verb (authorization.go's forbidden message).
    return Answer(res, watch_refusal_, watch_refusal_ == 403 ? "Forbidden" : "MethodNotAllowed",
                  absl::StrCat("resourceslices.", kGroup, " is forbidden: User \"system:serviceaccount:",
                               "kube-system:edgeaccel-device-plugin\" cannot watch resource ",
                               "\"resourceslices\" in API group \"", kGroup, "\" at the cluster scope"),
                  Details("", "resourceslices"));
  }
  for (const char* parameter : {"labelSelector", "dryRun"}) {
    if (!Query(req, parameter).empty()) {
      return Answer(res, 501, "NotImplemented",
                    absl::StrCat("the test API server does not implement ", parameter,
                                 " on resourceslices"));
    }
  }
  auto selector = std::make_shared<std::vector<Requirement>>();
  if (!ParseFieldSelector(Query(req, "fieldSelector"), *selector, res)) return;
  const std::string version = Query(req, "resourceVersion");
  const bool bookmarks = Query(req, "allowWatchBookmarks") == "true";
  int64_t timeout_seconds = 0;
  const std::string timeout = Query(req, "timeoutSeconds");
  if (!timeout.empty() && (!absl::SimpleAtoi(timeout, &timeout_seconds) || timeout_seconds < 0)) {
    return Answer(res, 400, "BadRequest", absl::StrCat("invalid timeoutSeconds: ", timeout));
  }
  if (timeout_seconds == 0) {
    thread_local std::mt19937 random(std::random_device{}());
    timeout_seconds = std::uniform_int_distribution<int64_t>(1800, 3600)(random);
  }
  // What the stream holds before any change: ADDED for each slice (no version or "0"), or the
  // 410 for a version older than the history.
  std::vector<json> first;
  uint64_t from = revision_;
  bool expired = false;
  if (version.empty() || version == "0") {
    for (const auto& [name, slice] : slices_) {
      if (Selected(slice, *selector)) first.push_back({{"type", "ADDED"}, {"object", slice}});
    }
  } else if (uint64_t asked = 0; !absl::SimpleAtoi(version, &asked)) {
    return Answer(res, 400, "BadRequest", absl::StrCat("invalid resource version: ", version));
  } else if (asked < slice_history_start_) {
    json status = {{"kind", "Status"}, {"apiVersion", "v1"}, {"metadata", json::object()},
                   {"status", "Failure"},
                   {"message", absl::StrCat("too old resource version: ", asked, " (",
                                            slice_history_start_, ")")},
                   {"reason", "Expired"}, {"code", 410}};
    first.push_back({{"type", "ERROR"}, {"object", status}});
    expired = true;
  } else {
    from = asked;
  }
  open_slice_watches_++;
  struct Stream {
    uint64_t from;
    std::vector<json> first;
    bool expired;
    absl::Time ends;
    uint64_t ends_seen, bookmarks_seen;
    bool bookmarks;
    bool closed = false;
  };
  auto stream = std::make_shared<Stream>(Stream{from, std::move(first), expired,
                                                absl::Now() + absl::Seconds(timeout_seconds),
                                                watch_ends_, watch_bookmarks_, bookmarks});
  if (end_watches_at_once_) {
    stream->first.clear();
    stream->ends = absl::Now();
  }
  res.set_chunked_content_provider(
      "application/json",
      [this, stream, selector](size_t, httplib::DataSink& sink) {
        std::vector<json> out;
        bool done = false;
        {
          absl::MutexLock lock(&mu_);
          auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
            return !stream->first.empty() || closing_ || stream->expired ||
                   watch_ends_ != stream->ends_seen ||
                   (stream->bookmarks && watch_bookmarks_ != stream->bookmarks_seen) ||
                   (!slice_events_.empty() && slice_events_.back().revision > stream->from);
          };
          // A bounded wait, so that a client gone is noticed (is_writable) between waits.
          mu_.AwaitWithDeadline(absl::Condition(&ready),
                                std::min(stream->ends, absl::Now() + absl::Milliseconds(200)));
          out.swap(stream->first);
          for (const SliceEvent& event : slice_events_) {
            if (event.revision <= stream->from) continue;
            stream->from = event.revision;
            if (Selected(event.object, *selector)) {
              out.push_back({{"type", event.type}, {"object", event.object}});
            }
          }
          if (stream->bookmarks && watch_bookmarks_ != stream->bookmarks_seen) {
            stream->bookmarks_seen = watch_bookmarks_;
            stream->from = std::max(stream->from, revision_);
            out.push_back({{"type", "BOOKMARK"},
                           {"object",
                            {{"kind", "ResourceSlice"},
                             {"apiVersion", kApiVersion},
                             {"metadata", {{"resourceVersion", std::to_string(stream->from)}}}}}});
          }
          done = stream->expired || closing_ || watch_ends_ != stream->ends_seen ||
                 absl::Now() >= stream->ends;
        }
        for (const json& event : out) {
          const std::string line = event.dump() + "\n";
          if (!sink.write(line.data(), line.size())) done = true;
        }
        if (done || !sink.is_writable()) {
          {
            absl::MutexLock lock(&mu_);
            if (!stream->closed) open_slice_watches_--;
            stream->closed = true;
          }
          sink.done();
        }
        return true;
      },
      [this, stream](bool) {
        absl::MutexLock lock(&mu_);
        if (!stream->closed) open_slice_watches_--;
        stream->closed = true;
      });
}

int TestApiServer::resource_slice_lists() {
  absl::MutexLock lock(&mu_);
  return slice_lists_;
}

int TestApiServer::resource_slice_watches() {
  absl::MutexLock lock(&mu_);
  return slice_watches_;
}

int TestApiServer::open_slice_watches() {
  absl::MutexLock lock(&mu_);
  return open_slice_watches_;
}

void TestApiServer::CompactSliceHistory() {
  absl::MutexLock lock(&mu_);
  slice_events_.clear();
  slice_history_start_ = revision_;
}

void TestApiServer::EndSliceWatches() {
  absl::MutexLock lock(&mu_);
  watch_ends_++;
}

void TestApiServer::BookmarkSliceWatches() {
  absl::MutexLock lock(&mu_);
  revision_++;  // the watch cache's progress: a bookmark tells of a revision nothing changed at
  watch_bookmarks_++;
}

void TestApiServer::EndSliceWatchesAtOnce(bool at_once) {
  absl::MutexLock lock(&mu_);
  end_watches_at_once_ = at_once;
}

void TestApiServer::RefuseSliceWatches(int status) {
  absl::MutexLock lock(&mu_);
  watch_refusal_ = status;
}

}  // namespace edgeaccel::testing
