#pragma once

/// \file
/// The metadata file of a sharded checkpoint. A checkpoint directory holds one data
/// file per rank, each a concatenation of raw element ranges of named tensors, and
/// one metadata file saying where every element is; this header writes that file
/// (`serialize`) and includes what reads it (`parse`, parse.hpp) and checks it
/// (`validate`, validate.hpp); metadata.hpp holds the types.
///
/// The metadata is text, one item per line, every line ending in '\n', fields
/// separated by exactly one space, lines in exactly this order:
///
///     unison-checkpoint 3                     magic and format version (1, 2 or 3)
///     world_size <u32>                        ranks that wrote the checkpoint, >= 1
///     layout <word>                           e.g. zero3, fsdp_hybrid (informational)
///     optimizer <word>                        e.g. adamw, sgd, none
///     step <u64>                              optimizer steps taken
///     loss_scale <double>                     > 0 and finite
///     good_steps <u64>                        loss scaler's steps since the last overflow
///     kinds <K>                               then K lines, unique words:
///     kind <word>                               param, exp_avg, exp_avg_sq, momentum, ...
///     tensors <T>                             then T lines, unique non-empty names:
///     tensor <numel> <length> <name>
///     tensor_steps <S>                        (version 3 only) then S lines:
///     tensor_step <tensor> <u64>                a tensor that took fewer steps
///     files <F>                               then F lines, unique names:
///     file <bytes> <hex> <length> <name>        <hex>: checksum of the file's bytes
///     ranges <R>                              then R lines, in any order:
///     range <file> <tensor> <kind> <offset> <count> <dtype> <file_offset>
///     checksum <hex>                          checksum of every byte before this line
///
/// where
///   - <u32>, <u64>, K, T, S, F, R, <numel>, <length>, <bytes>, <offset>, <count> and
///     <file_offset> are decimal digits: no sign, no leading zeros, within the type
///     (u64 unless the line says u32; <file>, <tensor> and <kind> are u32);
///   - <double> is written as printf's "%.17g" writes it (so it reads back exactly)
///     and read by std::from_chars;
///   - <hex> is exactly 16 lowercase hexadecimal digits: a checksum, XXH3-64 (seed
///     0) from version 2, FNV-1a 64 in version 1 (`checkpoint::checksum`); versions
///     1 and 2 differ in nothing else, version 3 adds the tensor_steps lines;
///   - <word> is one or more ASCII letters, digits and '_';
///   - <name> is the rest of the line: exactly <length> bytes, any bytes but '\n'.
///     A file name is relative to the checkpoint directory: not ".", not "..", no
///     '/' and no NUL;
///   - <dtype> is `unison::to_string` of a floating dtype: double, float, half or
///     bfloat16.
///
/// A tensor_step line says that tensor <tensor> (an index into the tensor lines)
/// took <u64> optimizer steps, fewer than `step`: in the others no rank gave it a
/// gradient, and the optimizer left it and its state as they were. Tensors without
/// a line took every step.
///
/// A range line says that elements [<offset>, <offset> + <count>) of kind <kind>
/// (an index into the kind lines, 0-based) of tensor <tensor> (an index into the
/// tensor lines) are stored in file <file> (an index into the file lines) at bytes
/// [<file_offset>, <file_offset> + <count> * size_of(<dtype>)), as <dtype>.
///
/// `validate` adds the rules the grammar cannot say: every range is non-empty, its
/// indices are in range, it ends within its tensor and within its file (without
/// overflowing); ranges of one file do not share bytes; and the ranges of each
/// (tensor, kind) pair tile the tensor exactly, [0, numel) with no overlap and no
/// gap, except that a tensor with numel 0 has no ranges; tensor_step lines name
/// tensors in increasing order, each with fewer steps than `step`. It runs in O(R log R) plus
/// the sorting of the names.

#include "unison/checkpoint/metadata.hpp"
#include "unison/checkpoint/parse.hpp"
#include "unison/checkpoint/validate.hpp"
#include "unison/core/dtype.hpp"

#include <cstdint>
#include <string>

namespace unison::checkpoint {

/// The metadata file's text for `m`, deterministic (equal metadata, equal bytes). `m`
/// should pass `validate`; `parse` rejects the text of one that does not.
inline std::string serialize(const metadata& m) {
    std::string s;
    const auto line = [&s](const auto&... parts) {
        ((s += parts), ...);
        s += '\n';
    };
    const auto num = [](std::uint64_t v) { return std::to_string(v); };
    line(detail::checkpoint_magic, " ", num(m.version));
    line("world_size ", num(m.world_size));
    line("layout ", m.layout);
    line("optimizer ", m.optimizer);
    line("step ", num(m.step));
    line("loss_scale ", detail::checkpoint_format_double(m.loss_scale));
    line("good_steps ", num(m.good_steps));
    line("kinds ", num(m.kinds.size()));
    for (const std::string& kind : m.kinds) {
        line("kind ", kind);
    }
    line("tensors ", num(m.tensors.size()));
    for (const tensor_entry& t : m.tensors) {
        line("tensor ", num(t.numel), " ", num(t.name.size()), " ", t.name);
    }
    if (m.version >= 3) {
        line("tensor_steps ", num(m.tensor_steps.size()));
        for (const tensor_step_entry& t : m.tensor_steps) {
            line("tensor_step ", num(t.tensor), " ", num(t.steps));
        }
    }
    line("files ", num(m.files.size()));
    for (const file_entry& f : m.files) {
        line("file ", num(f.bytes), " ", detail::checkpoint_hex(f.checksum), " ",
             num(f.name.size()), " ", f.name);
    }
    line("ranges ", num(m.ranges.size()));
    for (const range_entry& r : m.ranges) {
        line("range ", num(r.file), " ", num(r.tensor), " ", num(r.kind), " ", num(r.offset), " ",
             num(r.count), " ", to_string(r.type), " ", num(r.file_offset));
    }
    line("checksum ", detail::checkpoint_hex(checksum(m.version, s.data(), s.size())));
    return s;
}

} // namespace unison::checkpoint
