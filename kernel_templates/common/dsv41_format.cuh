#pragma once
// The DeepSeek-V4.1 cache records, FOOTER layout (runtime/dsv41_writer/README.md): page p holds
// page_size data rows, then page_size scale rows. Host- and device-visible, no includes.

namespace kiln {

constexpr int kDsv41MainDataBytes = 512;   // 512 E4M3 codes
constexpr int kDsv41MainScaleBytes = 16;   // 16 UE8M0 scales, one per 32 dims
constexpr int kDsv41MainRecordBytes = 528;
constexpr int kDsv41ExtraDataBytes = 256;  // 512 E2M1 codes, two per byte (low nibble first)
constexpr int kDsv41ExtraScaleBytes = 32;  // 32 E4M3 scales, one per 16 dims
constexpr int kDsv41ExtraRecordBytes = 288;

}  // namespace kiln
