#include "engine/tokenizer/json_reader.h"

#include "engine/common/bounded_text.h"

namespace snapserve::tokenizer {

using json = nlohmann::json;

namespace {

bool IsInteger(const json& j) { return j.is_number_integer(); }  // signed or unsigned

// nlohmann's type name, but integers and floats told apart: a float where an
// id is expected is as wrong as a string.
std::string KindOf(const json& j) {
  if (j.is_number_integer()) return "integer " + j.dump();
  if (j.is_number_float()) return "number " + j.dump();
  if (j.is_string()) return "string " + Bounded(j.dump(), 64);
  return j.type_name();
}

}  // namespace

std::string JsonReader::Path(std::string_view where, std::string_view key) {
  if (where.empty()) return std::string(key);
  return std::string(where) + "." + std::string(key);
}

Status JsonReader::Error(std::string_view field, std::string_view what) const {
  return Status::InvalidArgument(file_ + ": " + std::string(field) + ": " + std::string(what));
}

Status JsonReader::WrongType(std::string_view field, std::string_view expected,
                             const json& j) const {
  return Error(field, "expected " + std::string(expected) + ", got " + KindOf(j));
}

StatusOr<const json*> JsonReader::Member(const json& parent, const char* key,
                                         std::string_view where, json::value_t type,
                                         std::string_view expected) const {
  if (!parent.is_object())
    return WrongType(where.empty() ? "top level" : where, "an object", parent);
  auto it = parent.find(key);
  if (it == parent.end() || it->is_null()) return static_cast<const json*>(nullptr);
  const bool ok = type == json::value_t::number_integer ? IsInteger(*it) : it->type() == type;
  if (!ok) return WrongType(Path(where, key), expected, *it);
  return &*it;
}

StatusOr<const json*> JsonReader::Object(const json& parent, const char* key,
                                         std::string_view where) const {
  return Member(parent, key, where, json::value_t::object, "an object");
}

StatusOr<const json*> JsonReader::Array(const json& parent, const char* key,
                                        std::string_view where) const {
  return Member(parent, key, where, json::value_t::array, "an array");
}

StatusOr<std::optional<std::string>> JsonReader::String(const json& parent, const char* key,
                                                        std::string_view where) const {
  SNAPSERVE_ASSIGN_OR_RETURN(const json* j,
                             Member(parent, key, where, json::value_t::string, "a string"));
  if (j == nullptr) return std::optional<std::string>();
  return std::optional<std::string>(j->get<std::string>());
}

StatusOr<std::optional<bool>> JsonReader::Bool(const json& parent, const char* key,
                                               std::string_view where) const {
  SNAPSERVE_ASSIGN_OR_RETURN(const json* j,
                             Member(parent, key, where, json::value_t::boolean, "true or false"));
  if (j == nullptr) return std::optional<bool>();
  return std::optional<bool>(j->get<bool>());
}

StatusOr<std::optional<int64_t>> JsonReader::Int(const json& parent, const char* key,
                                                 std::string_view where) const {
  SNAPSERVE_ASSIGN_OR_RETURN(
      const json* j, Member(parent, key, where, json::value_t::number_integer, "an integer"));
  if (j == nullptr) return std::optional<int64_t>();
  if (j->is_number_unsigned() && j->get<uint64_t>() > uint64_t{INT64_MAX}) {
    return Error(Path(where, key), "integer " + j->dump() + " is out of range");
  }
  return std::optional<int64_t>(j->get<int64_t>());
}

StatusOr<int32_t> JsonReader::TokenId(const json& j, std::string_view field, int64_t limit,
                                      std::string_view limit_name) const {
  if (!IsInteger(j)) return WrongType(field, "a token id (an integer)", j);
  const bool negative = j.is_number_integer() && !j.is_number_unsigned() && j.get<int64_t>() < 0;
  if (negative || j.get<uint64_t>() >= static_cast<uint64_t>(limit)) {
    return Error(field, "token id " + j.dump() + " is outside the vocabulary (" +
                            std::string(limit_name) + " " + std::to_string(limit) + ")");
  }
  return static_cast<int32_t>(j.get<int64_t>());
}

}  // namespace snapserve::tokenizer
