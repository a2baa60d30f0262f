#pragma once

/// \file
/// Sharded checkpoints' on-disk layer: the metadata format (`serialize`, `parse`,
/// `validate`), durable POSIX file writes and verified reads, and `checkpoint_error`.

#include "unison/checkpoint/error.hpp"
#include "unison/checkpoint/format.hpp"
#include "unison/checkpoint/io.hpp"
