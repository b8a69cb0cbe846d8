#pragma once
// Plain results of CubinStore's maintenance calls (list / verify / prune / stats), for the CLI.
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

// Where an entry came from. kMemory: built by get_or_build but not persisted (unwritable cache).
enum class Tier { kReadOnly, kWritable, kMemory };

std::string_view tier_name(Tier tier);  // "read_only", "writable", "memory"

struct ListedEntry {
  std::string key_hex;       // from the file name
  std::string semantic_key;  // from the entry header; empty if the header is damaged
  std::string problem;       // why the header could not be read; empty when fine (`verify` checks fully)
  std::uint64_t bytes = 0;
  Tier tier = Tier::kWritable;
  std::filesystem::path layer;  // the layer's root directory
  std::filesystem::path file;
  std::chrono::system_clock::time_point mtime;  // last publish or (coarsely) last hit
};

struct BadEntry {
  std::filesystem::path file;
  Tier tier = Tier::kWritable;
  std::string reason;
  bool quarantined = false;  // false in read-only layers, which kiln never modifies
};

struct VerifyReport {
  std::uint64_t checked = 0;
  std::vector<BadEntry> bad;
  bool ok() const { return bad.empty(); }
};

struct PruneReport {
  std::uint64_t removed_entries = 0;
  std::uint64_t freed_bytes = 0;  // entries and quarantined files together
  std::uint64_t removed_quarantined = 0;
  std::uint64_t remaining_entries = 0;
  std::uint64_t remaining_bytes = 0;
};

struct LayerStats {
  std::filesystem::path root;
  Tier tier = Tier::kWritable;
  bool present = false;  // the layer directory exists
  std::uint64_t entries = 0;
  std::uint64_t bytes = 0;
};

struct StoreStats {
  std::vector<LayerStats> layers;  // read-only layers in search order, then the writable one
  std::uint64_t quarantined = 0;
  std::uint64_t quarantined_bytes = 0;
  std::uint64_t temp_files = 0;  // publishes in flight, or left by a killed publisher
  bool writable = false;
};

}  // namespace kiln
