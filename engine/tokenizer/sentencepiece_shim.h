// The C interface of libsnapserve_sentencepiece.so, the one module that links
// Debian's libsentencepiece (sentencepiece_shim.cc).
//
// Why a separately loaded module: libsentencepiece.so.0 carries its own copy
// of protobuf-lite (3.14) and exports those symbols. Linked into a process
// that also loads the system libprotobuf.so.32 (gRPC's), whichever comes
// first in the link order serves both: protobuf's own static initializers
// then ran sentencepiece's copy and crashed before main (seen in
// unit_server_test), or sentencepiece would run against protobuf 3.21's
// internals. sentencepiece_model.cc therefore dlopen()s this module with
// RTLD_LOCAL | RTLD_DEEPBIND: its symbols stay out of the process's global
// scope and its own references bind to its own copies first. Nothing crosses
// the boundary but plain C values and caller-owned buffers.
//
// What no dlopen flag separates: GNU-unique symbols (C++ function-local
// statics such as protobuf's ShutdownData::get()::data) are unified across the
// whole process. libprotobuf 3.21 and the bundled 3.14 agree on that layout,
// so the server is fine (tests/python/test_sentencepiece_parity.py runs a real
// server with a SentencePiece model), but a third, newer protobuf in the same
// process does not: grpc_tools' in-process protoc corrupted the heap of the
// pytest process that loaded a SentencePiece tokenizer, so the tests run
// protoc in a child process (tests/python/conftest.py).
#pragma once

#include <stddef.h>
#include <stdint.h>

extern "C" {

// Parses a serialized ModelProto. Returns a handle, or nullptr with a message
// in err[0..err_cap) (NUL-terminated).
using SnapserveSpmLoadFn = void* (*)(const char* data, size_t size, char* err, size_t err_cap);
using SnapserveSpmFreeFn = void (*)(void* handle);
using SnapserveSpmSizeFn = int (*)(void* handle);
// Copies piece `id`'s text into out[0..cap) and returns its full length.
using SnapserveSpmPieceFn = size_t (*)(void* handle, int id, char* out, size_t cap);
// Bit 0: control piece, bit 1: unknown piece, bit 2: byte-fallback piece.
using SnapserveSpmFlagsFn = int (*)(void* handle, int id);
using SnapserveSpmPieceToIdFn = int (*)(void* handle, const char* piece, size_t len);
// bos_id() and eos_id() of the model (negative when it has none).
using SnapserveSpmSpecialIdFn = int (*)(void* handle);
// Encodes text; writes up to `cap` ids to `out` and returns how many there are
// (call again with a larger buffer when that exceeds cap), or -1 on failure.
using SnapserveSpmEncodeFn = int64_t (*)(void* handle, const char* text, size_t len, int* out,
                                         size_t cap);

// Exported names, looked up with dlsym.
inline constexpr const char* kSnapserveSpmSymbols[] = {
    "snapserve_spm_load",   "snapserve_spm_free",   "snapserve_spm_size",
    "snapserve_spm_piece",  "snapserve_spm_flags",  "snapserve_spm_piece_to_id",
    "snapserve_spm_bos_id", "snapserve_spm_eos_id", "snapserve_spm_encode"};
}
