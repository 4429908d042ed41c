// JSON text helpers shared by the model and plan printers.
//
// FlatBuffers' own text generator prints doubles with a fixed 12 decimals,
// which loses small values (1e-15 prints as 0.0) and breaks the exact round
// trip. strata's printers follow the schema field for field, print doubles in
// their shortest exact form and keep short arrays on one line; the result is
// read back by flatbuffers::Parser with the embedded schema.
#pragma once

#include <cstring>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>
#include <string_view>
#include <type_traits>

#include <flatbuffers/flatbuffers.h>

namespace strata::serialization::json_text {

inline void append_json_string(std::string &out, std::string_view text) {
  out += '"';
  for (char c : text) {
    auto byte = static_cast<unsigned char>(c);
    switch (c) {
    case '"': out += "\\\""; break;
    case '\\': out += "\\\\"; break;
    case '\n': out += "\\n"; break;
    case '\t': out += "\\t"; break;
    case '\r': out += "\\r"; break;
    default:
      if (byte < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "\\u%04x", byte);
        out += buf;
      } else {
        out += c;
      }
    }
  }
  out += '"';
}

inline void append_json_string(std::string &out, const flatbuffers::String *text) {
  append_json_string(out, text ? text->string_view() : std::string_view());
}

inline void append_double(std::string &out, double value) {
  if (std::isnan(value)) {
    out += "nan";
    return;
  }
  if (std::isinf(value)) {
    out += value < 0 ? "-inf" : "inf";
    return;
  }
  char buf[64];
  auto result = std::to_chars(buf, buf + sizeof(buf), value);
  std::string_view text(buf, static_cast<size_t>(result.ptr - buf));
  out += text;
  // Keep a float looking like one to a reader.
  if (text.find_first_of(".e") == std::string_view::npos) out += ".0";
}

template <typename T>
inline void append_number_list(std::string &out, const flatbuffers::Vector<T> *v) {
  out += '[';
  if (v != nullptr)
    for (flatbuffers::uoffset_t i = 0; i < v->size(); ++i) {
      if (i) out += ", ";
      T value; // copied: a vector of 8-byte numbers may be only 4-byte aligned
      std::memcpy(&value, v->Data() + i * sizeof(T), sizeof(T));
      if constexpr (std::is_floating_point_v<T>)
        append_double(out, value);
      else
        out += std::to_string(value);
    }
  out += ']';
}

// Writes `"key": ` at `indent`, preceded by a comma and newline unless first.
class JsonObjectWriter {
public:
  JsonObjectWriter(std::string &out, int indent) : out_(out), indent_(indent) { out_ += "{"; }
  std::string &key(std::string_view name) {
    out_ += first_ ? "\n" : ",\n";
    first_ = false;
    out_.append(static_cast<size_t>(indent_ + 2), ' ');
    out_ += '"';
    out_ += name;
    out_ += "\": ";
    return out_;
  }
  void close() {
    out_ += '\n';
    out_.append(static_cast<size_t>(indent_), ' ');
    out_ += '}';
  }

private:
  std::string &out_;
  int indent_;
  bool first_ = true;
};

template <typename T, typename Fn>
void append_table_list(std::string &out, const flatbuffers::Vector<flatbuffers::Offset<T>> *v,
                       int indent, Fn &&append_one) {
  if (v == nullptr || v->size() == 0) {
    out += "[]";
    return;
  }
  out += '[';
  for (flatbuffers::uoffset_t i = 0; i < v->size(); ++i) {
    out += i ? ",\n" : "\n";
    out.append(static_cast<size_t>(indent + 2), ' ');
    append_one(*v->Get(i), indent + 2);
  }
  out += '\n';
  out.append(static_cast<size_t>(indent), ' ');
  out += ']';
}

} // namespace strata::serialization::json_text
