#pragma once
/// \file
/// Registration of the built-in node types. Each family registers itself by an explicit call; a
/// program builds its own Registry, adds these and its own types, and may replace any by name.

#include "flowfeed/registry.hpp"

namespace flowfeed {

/// Every built-in type of this build (flowfeed::nodes): load, images (or their placeholders),
/// transform, staging, upload and train families, `mlp`, and the CUDA family (real types when
/// built with CUDA, placeholders that fail validation otherwise).
void register_builtin_nodes(Registry& registry);
/// A registry holding every built-in type (register_builtin_nodes on an empty one).
Registry builtin_registry();

// flowfeed::core_nodes

/// `synthetic`, `memory`, `idx`, `npy`, `tokens`.
void register_load_nodes(Registry& registry);
/// `normalize`, `delay`.
void register_transform_nodes(Registry& registry);
/// `host_staging`.
void register_staging_nodes(Registry& registry);
/// `host_upload`.
void register_upload_nodes(Registry& registry);
/// `checksum`, `sleep`, `record`, `discard`.
void register_train_nodes(Registry& registry);
/// Placeholders for the image types (in every build): `webdataset`, `image_folder` and
/// `random_flip` exist and fail validation with "unavailable in this build (flowfeed was built
/// without image support ...)".
void register_image_placeholders(Registry& registry);
/// `pinned_staging`, `cuda_upload`, `device_normalize`, `device_checksum`, `device_discard`, the
/// device probe, and a
/// `memory` loader that page-locks its data set; in a build without CUDA, the placeholders below.
void register_cuda_nodes(Registry& registry);
/// Placeholders for the CUDA types (in every build): the names exist and fail validation with
/// "unavailable in this build", or swap to their host counterparts; cuda_built() becomes false.
void register_cuda_placeholders(Registry& registry);

// flowfeed::image_nodes (builds with image support: FLOWFEED_IMAGES)

/// `webdataset`, `image_folder`, `random_flip`.
void register_image_nodes(Registry& registry);

// flowfeed::mlp

/// `mlp` (the train node: CPU, and cuBLAS on the CUDA backend).
void register_mlp(Registry& registry);

}  // namespace flowfeed
